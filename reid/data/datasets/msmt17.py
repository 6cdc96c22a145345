"""MSMT17, V1 or V2 (V1 is used when both exist):
``<root>/msmt17/MSMT17_V1/{train,test,list_train.txt,list_val.txt,list_query.txt,list_gallery.txt}`` or
``<root>/msmt17/MSMT17_V2/{mask_train_v2,mask_test_v2,list_*.txt}``. ``MSMT17_V1``/``V2`` directly under the
root, or under ``<root>/msmt17v2`` (the original ACL setup), are accepted too.
List lines are ``0000/0000_000_01_0303morning_0015_0.jpg 0``: a path relative to the train/test folder and
the pid; the camera is the third ``_`` field of the file name (1-based, 15 cameras).
Standard counts: 1,041 ids / 30,248 train images (+2,373 val, added only with ``combineall``);
11,659 query; 82,161 gallery.
"""
import os

from reid.errors import UserError
from reid.data.datasets.bases import ReidDataset, missing_layout_error
from reid.data.datasets.registry import DATASET_REGISTRY

VERSIONS = (("MSMT17_V1", "train", "test"), ("MSMT17_V2", "mask_train_v2", "mask_test_v2"))
LIST_FILES = ("list_train.txt", "list_val.txt", "list_query.txt", "list_gallery.txt")


@DATASET_REGISTRY.register()
class MSMT17(ReidDataset):
    name = "MSMT17"
    layout = ("<root>/msmt17/MSMT17_V1/{train,test,list_train.txt,list_val.txt,list_query.txt,list_gallery.txt} "
              "or <root>/msmt17/MSMT17_V2/{mask_train_v2,mask_test_v2,list_*.txt}")

    def _find_version(self):
        for base in (os.path.join(self.root, "msmt17"), self.root, os.path.join(self.root, "msmt17v2")):
            for version, train, test in VERSIONS:
                main = os.path.join(base, version)
                if os.path.isdir(main):
                    return main, train, test
        raise missing_layout_error(self.name, self.root, self.layout, os.path.join(self.root, "msmt17", "MSMT17_V1"))

    def load(self):
        main, train_name, test_name = self._find_version()
        self.data_dir = main
        train_dir, test_dir = os.path.join(main, train_name), os.path.join(main, test_name)
        lists = [os.path.join(main, f) for f in LIST_FILES]
        self.require([train_dir, test_dir, lists[0], lists[2], lists[3]])
        self._train = self._read_list(lists[0], train_dir, True)
        if self.combineall and os.path.isfile(lists[1]):
            self._train += self._read_list(lists[1], train_dir, True)  # val images are of training ids
        self._query = self._read_list(lists[2], test_dir, False)
        self._gallery = self._read_list(lists[3], test_dir, False)

    def _read_list(self, list_path, image_dir, is_train):
        records = []
        with open(list_path) as fh:
            for lineno, line in enumerate(fh, 1):
                fields = line.split()
                if not fields:
                    continue
                try:
                    if len(fields) != 2:
                        raise ValueError
                    rel, pid = fields[0], int(fields[1])
                    cam = int(os.path.basename(rel).split("_")[2]) - 1
                    if cam < 0:
                        raise ValueError
                except (ValueError, IndexError):
                    raise UserError("%s line %d: expected '<relative path of PID_INDEX_CAM_...jpg> <pid>', got %r; "
                                    "restore the original MSMT17 list file" % (list_path, lineno, line.strip())) from None
                path = os.path.join(image_dir, rel)
                if is_train:
                    records.append((path, "%s_%d" % (self.name, pid), "%s_%d" % (self.name, cam), self.domain))
                else:
                    records.append((path, pid, cam, self.domain))
        return records
