"""CUHK03-NP, the 767/700 new-protocol release (Zhong et al., CVPR 2017) in Market-1501 layout:
``<root>/cuhk03-np/{labeled,detected}/{bounding_box_train,query,bounding_box_test}/*.png`` with names
``0001_c1_1.png`` (pid 0001, camera 1 of 2). ``labeled=True`` (``DATASETS.CUHK03_LABELED``) picks the
hand-labeled boxes, else the detected ones. This release has one train/test split (``DATASETS.CUHK03_SPLIT``
0); the classic 20 random 1,367/100 splits need the original ``cuhk-03.mat`` and are not supported.
Standard counts: labeled 767 ids / 7,368 train, 1,400 query, 5,328 gallery; detected 7,365 / 1,400 / 5,332.
"""
import os

from reid.errors import UserError
from reid.data.datasets.market1501 import MarketLayoutDataset
from reid.data.datasets.registry import DATASET_REGISTRY


@DATASET_REGISTRY.register()
class CUHK03(MarketLayoutDataset):
    name = "CUHK03"
    layout = "<root>/cuhk03-np/{labeled,detected}/{bounding_box_train,query,bounding_box_test}/*.png"

    def __init__(self, root, labeled=True, split=0, **kwargs):
        if isinstance(split, bool) or split != 0:
            raise UserError("DATASETS.CUHK03_SPLIT %r is not supported (CUHK03-NP, the 767/700 protocol, has a "
                            "single split); use DATASETS.CUHK03_SPLIT 0" % (split,))
        self.subset = "labeled" if labeled else "detected"
        super(CUHK03, self).__init__(root, **kwargs)

    def candidate_dirs(self):
        return [os.path.join(self.root, base, self.subset) for base in ("cuhk03-np", "cuhk03_np", "cuhk03np")]
