"""ACL losses (docs/method.md#losses): per-domain CE, triplet (basic and meta), SCT, cluster and center losses.

Plain torch: all take tensors and return a scalar tensor that is differentiable on every backend. Input checks
that read labels on the host run op by op and are skipped while a graph is built
(`torch.compiler.is_compiling()`). The per-chunk evaluation that emulates the original's 4-GPU DataParallel is the
trainer's (reid/engine/objectives.py).
"""
from reid.losses.center import center_loss
from reid.losses.cross_entropy import cross_entropy_loss, cross_entropy_per_domain
from reid.losses.domain import domain_sct_loss, inter_cluster_loss, intra_cluster_loss
from reid.losses.triplet import meta_triplet_masks, triplet_loss, triplet_loss_meta
from reid.losses.utils import cosine_dist, euclidean_dist, normalize

__all__ = ["center_loss", "cross_entropy_loss", "cross_entropy_per_domain", "domain_sct_loss",
           "inter_cluster_loss", "intra_cluster_loss", "meta_triplet_masks", "triplet_loss", "triplet_loss_meta",
           "cosine_dist", "euclidean_dist", "normalize"]
