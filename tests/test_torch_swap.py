"""The swap is literal: reid/modeling and reid/losses run on `import torch` alone.

The two packages are copied into a temporary folder with their one import line rewritten
(`from compat import torch, nn, F` -> `import torch` / `from torch import nn` / `import torch.nn.functional as F`),
beside the framework-free modules they import (reid/__init__.py, reid/errors.py, reid/registry.py), and imported
in a process where `compat` cannot be imported. There the ACL network at demo size (BASE_WIDTH 8, DEPTH 26x,
64x32 input; NUM_SPLITS 2 so that the chunked batch norm runs, no zero init so that every gradient is non-zero)
runs a training-mode forward, the losses of reid/losses on its outputs (the basic step's terms and the meta
terms) and a backward. The same script runs through the project as it is (compat on torch) in another process;
every output, loss term, gradient and running statistic must agree to 1e-6. Torch environment only.
"""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-6
IMPORT = re.compile(r"^from compat import ([\w, ]+)$", re.M)
TORCH_IMPORTS = "import torch\nfrom torch import nn\nimport torch.nn.functional as F"
FRAMEWORK_FREE = ("__init__.py", "errors.py", "registry.py")


def swap_copy(source_root, target):
    """reid/modeling and reid/losses of `source_root` copied under `target`/reid with the import swapped; returns
    the files whose import line was rewritten."""
    package = os.path.join(target, "reid")
    os.makedirs(package)
    for name in FRAMEWORK_FREE:
        if os.path.exists(os.path.join(source_root, "reid", name)):
            shutil.copy(os.path.join(source_root, "reid", name), package)
    rewritten = []
    for sub in ("modeling", "losses"):
        shutil.copytree(os.path.join(source_root, "reid", sub), os.path.join(package, sub),
                        ignore=shutil.ignore_patterns("__pycache__"))
        for folder, _, files in os.walk(os.path.join(package, sub)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                with open(path) as f:
                    text = f.read()
                swapped = IMPORT.sub(TORCH_IMPORTS, text)
                if swapped != text:
                    rewritten.append(os.path.relpath(path, target))
                    with open(path, "w") as f:
                        f.write(swapped)
    return rewritten


BLOCK_COMPAT = '''
import sys
class _NoCompat:
    def find_spec(self, name, path=None, target=None):
        if name == "compat" or name.startswith("compat."):
            raise ImportError("compat is not importable in the swapped run")
        return None
sys.meta_path.insert(0, _NoCompat())
'''

RUN = '''
import sys
import numpy as np
import torch
torch.set_num_threads(1)
from reid.modeling import ACLResNet, MetaEmbeddingHead, ReIDModel
from reid import losses as L

np.random.seed(0)
backbone = ACLResNet(base_width=8, last_stride=1, with_ibn=True, num_experts=4, blocks=(1, 1, 1, 1))
heads = MetaEmbeddingHead(backbone.feat_dim, [5, 4, 3], "gem", 3.0, 1.0, True)
model = ReIDModel(backbone, heads, [123.675, 116.28, 103.53], [58.395, 57.12, 57.375], num_splits=2)
model.train()
rng = np.random.RandomState(1)
images = torch.tensor((rng.rand(12, 3, 64, 32) * 255).astype(np.float32))
targets = torch.tensor(np.array([0, 0, 1, 1, 5, 5, 6, 6, 9, 9, 10, 10], np.int64))
domains = torch.tensor(np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2], np.int64))
out = model(images)
terms = {
    "ce": L.cross_entropy_per_domain(out["logits"], targets, domains, model.domain_offsets),
    "triplet": L.triplet_loss(out["features"], targets),
    "center": L.center_loss(out["center_dist"], targets),
    "sct": L.domain_sct_loss(out["features"], domains),
    "intra": L.intra_cluster_loss(out["paths"], domains),
    "inter": L.inter_cluster_loss(out["paths"], domains),
    "meta_mtrain": L.triplet_loss_meta(out["features"], targets, domains, "mtrain"),
    "meta_mtest": L.triplet_loss_meta(out["neck_feat"], targets, domains, "mtest", norm_feat=True),
    "meta_add": L.triplet_loss_meta(out["features"], targets, domains, "add"),
}
loss = sum(terms.values())
loss.backward()
arrays = {"loss": loss.detach().numpy()}
for k in ("features", "neck_feat", "feat_norm", "center_dist", "paths"):
    arrays["out/" + k] = out[k].detach().numpy()
for i, logits in enumerate(out["logits"]):
    arrays["out/logits%d" % i] = logits.detach().numpy()
for k, v in terms.items():
    arrays["loss/" + k] = v.detach().numpy()
for k, p in model.named_parameters():
    arrays["grad/" + k] = p.grad.numpy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
for k, b in model.named_buffers():
    arrays["buffer/" + k] = b.numpy()
np.savez(sys.argv[1], **arrays)
'''


def _run(folder, script, out, env):
    path = os.path.join(folder, "_swap_run.py")
    with open(path, "w") as f:
        f.write(script)
    proc = subprocess.run([sys.executable, path, out], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out) as data:
        return {k: data[k] for k in data.files}


def run_swapped(source_root, folder):
    """The script on the swapped copy of `source_root`'s packages, `compat` unimportable: {name: array}."""
    rewritten = swap_copy(source_root, os.path.join(folder, "swapped"))
    assert rewritten, "no `from compat import ...` line found to rewrite"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "REID_BACKEND")}
    env["PYTHONPATH"] = os.path.join(folder, "swapped")
    return _run(os.path.join(folder, "swapped"), BLOCK_COMPAT + RUN, os.path.join(folder, "swapped.npz"), env)


def run_project(folder):
    """The same script through the project as it is (compat on torch)."""
    env = dict(os.environ, PYTHONPATH=ROOT, REID_BACKEND="torch")
    return _run(folder, RUN, os.path.join(folder, "project.npz"), env)


@pytest.mark.skipif(compat.BACKEND != "torch", reason="the swapped code imports real torch: torch environment only")
def test_model_and_losses_run_on_plain_torch_with_the_import_swapped(tmp_path):
    swapped = run_swapped(ROOT, str(tmp_path))
    project = run_project(str(tmp_path))
    assert sorted(swapped) == sorted(project)
    assert sum(k.startswith("grad/") for k in project) > 100
    assert sum(np.abs(v).sum() > 0 for k, v in project.items() if k.startswith("grad/")) > 100
    for name in sorted(project):
        np.testing.assert_allclose(swapped[name], project[name], rtol=0, atol=TOL, err_msg=name)


def test_the_swap_rewrites_only_the_import_line(tmp_path):
    """Each module of reid/modeling and reid/losses imports the torch API as `from compat import ...` of torch, nn
    and F only, and nothing else from compat but reid/modeling/pretrained.py's checkpoint reading."""
    for sub in ("modeling", "losses"):
        for folder, _, files in os.walk(os.path.join(ROOT, "reid", sub)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                with open(os.path.join(folder, name)) as f:
                    text = f.read()
                for line in re.findall(r"^\s*(?:from compat\b.*|import compat\b.*)$", text, re.M):
                    names = IMPORT.match(line.strip())
                    allowed = name == "pretrained.py" and line.strip() == "from compat import checkpoint"
                    assert allowed or (names and set(n.strip() for n in names.group(1).split(","))
                                       <= {"torch", "nn", "F"}), "%s/%s: %s" % (sub, name, line)
                assert not re.search(r"\bcompat\.(?!checkpoint\b)\w+", text.replace("compat/", "")), (sub, name)
