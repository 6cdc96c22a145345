"""Market-1501: ``<root>/market1501/Market-1501-v15.09.15/{bounding_box_train,query,bounding_box_test}`` with
names ``0002_c1s1_000451_03.jpg`` (pid 0002, camera 1 of 6). ``Market-1501-v15.09.15`` directly under the
root, or the three folders directly under ``<root>/market1501``, are accepted too.
Standard counts: 751 ids / 12,936 train images; 3,368 query; 15,913 gallery (pid -1 junk dropped).
"""
import os

from reid.data.datasets.bases import (DISTRACTOR_PID, JUNK_PID, ReidDataset, missing_layout_error,
                                      parse_market_dir)
from reid.data.datasets.registry import DATASET_REGISTRY

SUBDIRS = ("bounding_box_train", "query", "bounding_box_test")


class MarketLayoutDataset(ReidDataset):
    """Any dataset stored as the three Market-1501 folders with Market-style file names."""
    junk_pids = (JUNK_PID, DISTRACTOR_PID)

    def candidate_dirs(self):
        raise NotImplementedError

    def load(self):
        data_dir = next((d for d in self.candidate_dirs() if all(os.path.isdir(os.path.join(d, s)) for s in SUBDIRS)),
                        None)
        if data_dir is None:
            first = next((d for d in self.candidate_dirs() if os.path.isdir(d)), self.candidate_dirs()[0])
            self.require([first] + [os.path.join(first, s) for s in SUBDIRS])
            raise missing_layout_error(self.name, self.root, self.layout, first)  # a subfolder that is a file
        self.data_dir = data_dir
        train_dir, query_dir, gallery_dir = (os.path.join(data_dir, s) for s in SUBDIRS)
        self._train = parse_market_dir(train_dir, self.name, True, self.domain)
        self._query = parse_market_dir(query_dir, self.name, False, self.domain)
        self._gallery = parse_market_dir(gallery_dir, self.name, False, self.domain)


@DATASET_REGISTRY.register()
class Market1501(MarketLayoutDataset):
    name = "Market1501"
    layout = "<root>/market1501/Market-1501-v15.09.15/{bounding_box_train,query,bounding_box_test}/*.jpg"

    def candidate_dirs(self):
        return [os.path.join(self.root, "market1501", "Market-1501-v15.09.15"),
                os.path.join(self.root, "Market-1501-v15.09.15"),
                os.path.join(self.root, "market1501")]
