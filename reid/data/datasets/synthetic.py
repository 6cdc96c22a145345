"""The built-in synthetic domains SynthA..SynthD: ``<root>/synthetic/SynthX/{bounding_box_train,query,
bounding_box_test}`` with Market-style names ``PPPP_cCsS_FFFFFF_00.jpg`` (pid -1 junk, pid 0 distractor),
written by ``reid.data.synthetic.ensure_synthetic(<root>/synthetic, ...)``. With ``generate=True`` (default)
the generator is asked first; it returns at once when the domain exists for this seed and identity count
(``DATASETS.SYNTHETIC.SEED`` / ``NUM_IDS``) and (re)builds it otherwise.
"""
import os

from reid.errors import UserError
from reid.data.datasets.market1501 import MarketLayoutDataset
from reid.data.datasets.registry import DATASET_REGISTRY

SYNTHETIC_DOMAINS = ("SynthA", "SynthB", "SynthC", "SynthD")


class SyntheticDomain(MarketLayoutDataset):
    layout = "<root>/synthetic/SynthX/{bounding_box_train,query,bounding_box_test}/PPPP_cCsS_FFFFFF_00.jpg"

    def __init__(self, root, seed=0, num_ids=300, generate=True, **kwargs):
        self.seed, self.num_ids, self.generate = int(seed), int(num_ids), bool(generate)
        super(SyntheticDomain, self).__init__(root, **kwargs)

    def candidate_dirs(self):
        return [os.path.join(self.root, "synthetic", self.name)]

    def load(self):
        if self.generate:
            try:
                from reid.data.synthetic import ensure_synthetic
            except ImportError as exc:
                raise UserError("cannot import the synthetic data generator to build %s under %s (%s)"
                                % (self.name, self.root, exc)) from None
            ensure_synthetic(os.path.join(self.root, "synthetic"), self.seed, self.num_ids, domains=[self.name])
        super(SyntheticDomain, self).load()


def _make(domain_name):
    cls = type(domain_name, (SyntheticDomain,), {"name": domain_name, "__doc__": "Synthetic domain %s." % domain_name})
    return DATASET_REGISTRY.register(cls)


SynthA, SynthB, SynthC, SynthD = (_make(n) for n in SYNTHETIC_DOMAINS)
