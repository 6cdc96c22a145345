"""CUHK03-NP, the 767/700 new-protocol release (Zhong et al., CVPR 2017) in Market-1501 layout:
``<root>/cuhk03-np/{labeled,detected}/{bounding_box_train,query,bounding_box_test}/*.png`` with names
``0001_c1_1.png`` (pid 0001, camera 1 of 2). ``labeled=True`` (``DATASETS.CUHK03_LABELED``) picks the
hand-labeled boxes, else the detected ones.
Standard counts: labeled 767 ids / 7,368 train, 1,400 query, 5,328 gallery; detected 7,365 / 1,400 / 5,332.
"""
import os

from reid.data.datasets.market1501 import MarketLayoutDataset
from reid.data.datasets.registry import DATASET_REGISTRY


@DATASET_REGISTRY.register()
class CUHK03(MarketLayoutDataset):
    name = "CUHK03"
    layout = "<root>/cuhk03-np/{labeled,detected}/{bounding_box_train,query,bounding_box_test}/*.png"

    def __init__(self, root, labeled=True, **kwargs):
        self.subset = "labeled" if labeled else "detected"
        super(CUHK03, self).__init__(root, **kwargs)

    def candidate_dirs(self):
        return [os.path.join(self.root, base, self.subset) for base in ("cuhk03-np", "cuhk03_np", "cuhk03np")]
