"""CUHK-SYSU person crops (training only): ``<root>/cuhksysu/cropped_images/*.jpg`` named ``p<pid>_s<n>.jpg``;
the pid is the name part before the first ``_``; one camera. ``<root>/cuhk_sysu/cropped_images`` (fast-reid's
name) is accepted too. Query and gallery are empty, so it is never a test set.
Standard counts (fast-reid's cropped version): 11,934 ids / 34,574 images.
"""
import logging
import os

from reid.data.datasets.bases import ReidDataset, list_images
from reid.data.datasets.registry import DATASET_REGISTRY

logger = logging.getLogger(__name__)


@DATASET_REGISTRY.register()
class CUHKSYSU(ReidDataset):
    name = "CUHKSYSU"
    layout = "<root>/cuhksysu/cropped_images/p<pid>_s<n>.jpg"

    def load(self):
        candidates = [os.path.join(self.root, d, "cropped_images") for d in ("cuhksysu", "cuhk_sysu", "CUHK-SYSU")]
        data_dir = next((d for d in candidates if os.path.isdir(d)), None)
        if data_dir is None:
            self.require([candidates[0]])
        self.data_dir = data_dir
        camid = "%s_0" % self.name
        unparsed = []
        for name in list_images(data_dir):
            prefix = name.split("_")[0] if "_" in name else ""
            if not prefix:
                unparsed.append(name)
                continue
            self._train.append((os.path.join(data_dir, name), "%s_%s" % (self.name, prefix), camid, self.domain))
        if unparsed:
            logger.warning("CUHKSYSU: skipped %d image(s) without a '<pid>_' prefix: %s", len(unparsed),
                           ", ".join(unparsed[:5]))
