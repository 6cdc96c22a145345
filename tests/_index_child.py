"""A rank of tests/test_index_sharded.py's run whose rank REID_TEST_DIE_RANK dies: tools/index.py, with that
rank killing itself (SIGKILL, as a crash would) when it starts extracting its shard.

    python tests/_index_child.py [tools/index.py arguments]
"""
import importlib.util
import os
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
    die_rank = int(os.environ["REID_TEST_DIE_RANK"])
    from reid.deploy import extractor
    extract_files = extractor.FeatureExtractor.extract_files

    def dying(self, *args, **kwargs):
        import compat
        if compat.distributed.group().rank == die_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        return extract_files(self, *args, **kwargs)
    extractor.FeatureExtractor.extract_files = dying
    spec = importlib.util.spec_from_file_location("tool_index", os.path.join(ROOT, "tools", "index.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(sys.argv[1:])


if __name__ == "__main__":
    main()
