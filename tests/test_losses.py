"""reid.losses on both backends against references written from the definitions (docs/method.md#losses).

Values: numpy float64 references with Python loops over rows. Gradients: real-torch autograd through
loop-based versions of the originals (boolean-mask selection per row, whole-tensor max/min), compared with
`compat.value_and_grad` on an `nn.Parameter` input. One process per backend computes every case.
"""
import numpy as np
import pytest

from tests.crossenv import active_backend, run_cases

ACTIVE = active_backend()
BACKENDS = ("mindspore", "torch")
HERE = "tests.test_losses"


# ------------------------------------------------------------------------------------------------ inputs
def make_inputs(seed=0):
    rng = np.random.RandomState(seed)
    inp = {}
    # continuous features: 3 domains x 2 ids x 2 images, ids interleaved so every split chunk holds several
    inp["cont_tgt"] = np.array([0, 2, 4, 1, 3, 5, 0, 2, 4, 1, 3, 5])
    inp["cont_dom"] = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2])
    inp["cont_emb"] = rng.randn(12, 6).astype(np.float32)
    # quarter-integer features: exact float32 distances, so duplicates and self-distances are exact on every
    # backend (clamped to 1e-6); rows 1 and 7 duplicate rows 0 and 6; ids 2, 5, 6 are singletons
    quant = rng.randint(-4, 5, size=(12, 8)).astype(np.float32) / 4
    quant[1], quant[7] = quant[0], quant[6]
    inp["quant_emb"] = quant
    inp["quant_tgt"] = np.array([0, 0, 0, 1, 1, 2, 3, 3, 4, 4, 5, 6])
    inp["quant_dom"] = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
    # router weights (positive, like a softmax); row 5 uniform, so its scalar-centroid distance is exactly 0
    paths = rng.rand(12, 16).astype(np.float32) + 0.05
    paths[5] = 0.5
    inp["paths"] = paths
    inp["paths_dom_gap"] = np.array([0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 2, 0])  # domain 1 absent
    inp["paths_dom_single"] = np.array([2, 1, 1, 2, 1, 0, 1, 1, 2, 2, 1, 1])  # domain 0 = row 5 alone
    # classifiers of 3 domains with 5, 3, 4 classes (global label offsets 0, 5, 8)
    inp["widths"], inp["offsets"] = [5, 3, 4], [0, 5, 8]
    inp["logits"] = [rng.randn(12, w).astype(np.float32) * 2 for w in inp["widths"]]
    inp["ce_dom"] = np.array([0, 0, 1, 2, 0, 1, 2, 2, 0, 1, 0, 2])
    local = np.array([rng.randint(w) for w in np.array(inp["widths"])[inp["ce_dom"]]])
    inp["ce_tgt"] = local + np.array(inp["offsets"])[inp["ce_dom"]]
    inp["ce_dom_gap"] = np.where(inp["ce_dom"] == 1, 2, inp["ce_dom"])  # domain 1 absent
    inp["ce_tgt_gap"] = np.where(inp["ce_dom"] == 1, 8 + local % 4, inp["ce_tgt"])
    sat = [l.copy() for l in inp["logits"]]
    sat[0][0] = 0.0
    sat[0][0, inp["ce_tgt"][0]] = 1000.0  # eps 0: this row's loss is exactly 0 and leaves the divisor
    inp["logits_saturated"] = sat
    inp["center_dist"] = (rng.rand(12, 13).astype(np.float32) * 3) ** 2
    inp["center_tgt"] = rng.randint(0, 13, size=12)
    # anchor 0's hardest negative is a tie between the duplicated rows 2 and 3
    inp["tie_emb"] = np.array([[1, 0, 0.5], [0.5, 0.25, 0], [-1, 0.5, 0.25], [-1, 0.5, 0.25]], np.float32)
    inp["tie_tgt"] = np.array([0, 0, 1, 1])
    # whole training objectives (reid.engine.objectives) on the continuous features: global labels consistent
    # with cont_dom and the offsets; pooled features before the BNNeck, on another scale than cont_emb
    inp["obj_tgt"] = np.array(inp["offsets"])[inp["cont_dom"]] + inp["cont_tgt"] % 2
    inp["pooled_emb"] = (rng.randn(12, 6) * 3).astype(np.float32)
    inp["paired_order"] = np.array([0, 6, 1, 7, 2, 8, 3, 9, 4, 10, 5, 11])   # each id's 2 images side by side
    return inp


# name -> (step kind, MODEL.NUM_SPLITS, MODEL.HEADS.NECK_FEAT, row order): the DataParallel chunking of the
# trainer's objectives, each chunk's terms against the loop references
OBJECTIVE_CASES = {
    "obj_basic_split2": ("basic", 2, "after", "paired"),
    "obj_basic_whole_before": ("basic", 1, "before", "paired"),
    "obj_mtrain_split2": ("mtrain", 2, "after", "interleaved"),    # each chunk: 3 domains x 2 ids
    "obj_mtrain_split2_before": ("mtrain", 2, "before", "interleaved"),
    "obj_mtest_split3_before": ("mtest", 3, "before", "paired"),
}


def objective_batch(inp, order):
    """Model outputs and batch (numpy) of an objective case, rows in `order`."""
    idx = inp["paired_order"] if order == "paired" else np.arange(12)
    return dict(feat_norm=inp["cont_emb"][idx], features=inp["pooled_emb"][idx],
                logits=[l[idx] for l in inp["logits"]], center_dist=inp["center_dist"][idx],
                paths=inp["paths"][idx], targets=inp["obj_tgt"][idx], domains=inp["cont_dom"][idx])


# --------------------------------------------------------------------------- case: runs under a backend
def _loss_calls(inp, c):
    """name -> zero-argument callable returning a backend scalar, on backend tensors made from `inp`."""
    from reid import losses as L
    T = c.as_tensor
    ce, cd, qe, qt, qd = T(inp["cont_emb"]), T(inp["cont_dom"]), T(inp["quant_emb"]), T(inp["quant_tgt"]), \
        T(inp["quant_dom"])
    ct, paths = T(inp["cont_tgt"]), T(inp["paths"])
    logits = [T(l) for l in inp["logits"]]
    cet, ced = T(inp["ce_tgt"]), T(inp["ce_dom"])
    big = T(inp["cont_emb"] * 200)
    same = T(np.zeros(12, np.int64))
    q6 = T(inp["quant_emb"][:6])
    return {
        "tri_cont": lambda: L.triplet_loss(ce, ct),
        "tri_cont_soft": lambda: L.triplet_loss(ce, ct, margin=0.0),
        "tri_cont_cos": lambda: L.triplet_loss(ce, ct, norm_feat=True),
        "tri_quant": lambda: L.triplet_loss(qe, qt),
        "tri_quant_soft": lambda: L.triplet_loss(qe, qt, margin=0.0),
        "tri_quant_weighted": lambda: L.triplet_loss(qe, qt, hard_mining=False),
        "tri_no_negative": lambda: L.triplet_loss(ce, same),
        "tri_overflow": lambda: L.triplet_loss(big, ct, margin=0.0),
        "meta_mtrain_cont": lambda: L.triplet_loss_meta(ce, ct, cd, "mtrain"),
        "meta_mtest_quant": lambda: L.triplet_loss_meta(qe, qt, qd, "mtest"),
        "meta_add_cont": lambda: L.triplet_loss_meta(ce, ct, cd, "add"),
        "meta_add_quant": lambda: L.triplet_loss_meta(qe, qt, qd, "add"),
        "meta_add_one_domain": lambda: L.triplet_loss_meta(q6, qt[:6], qd[:6], "add"),
        "meta_mtrain_weighted": lambda: L.triplet_loss_meta(qe, qt, qd, "mtrain", hard_mining=False),
        "meta_add_normfeat": lambda: L.triplet_loss_meta(ce, ct, cd, "add", norm_feat=True),
        "sct_cont": lambda: L.domain_sct_loss(ce, cd),
        "sct_quant": lambda: L.domain_sct_loss(qe, qd),
        "sct_one_domain": lambda: L.domain_sct_loss(qe[:6], qd[:6]),
        "sct_raw": lambda: L.domain_sct_loss(ce, cd, norm_feat=False),
        "intra_scalar": lambda: L.intra_cluster_loss(paths, cd),
        "intra_vector": lambda: L.intra_cluster_loss(paths, cd, centroid="vector"),
        "intra_gap": lambda: L.intra_cluster_loss(paths, T(inp["paths_dom_gap"])),
        "intra_single_scalar": lambda: L.intra_cluster_loss(paths, T(inp["paths_dom_single"])),
        "intra_single_vector": lambda: L.intra_cluster_loss(paths, T(inp["paths_dom_single"]), centroid="vector"),
        "inter_scalar": lambda: L.inter_cluster_loss(paths, cd),
        "inter_vector": lambda: L.inter_cluster_loss(paths, cd, centroid="vector"),
        "inter_gap": lambda: L.inter_cluster_loss(paths, T(inp["paths_dom_gap"])),
        "inter_gap_vector": lambda: L.inter_cluster_loss(paths, T(inp["paths_dom_gap"]), centroid="vector"),
        "inter_one_domain": lambda: L.inter_cluster_loss(paths, T(np.full(12, 2, np.int64))),
        # compiled steps pass every source domain's id and the losses weigh each by its presence
        # (reid/engine/steps.py): with domain 1 absent, and with one domain alone, the same values
        "sct_every_id_gap": lambda: L.domain_sct_loss(ce, T(inp["paths_dom_gap"]), present=(0, 1, 2)),
        "sct_every_id_one_domain": lambda: L.domain_sct_loss(qe[:6], qd[:6], present=(0, 1, 2)),
        "intra_every_id_gap": lambda: L.intra_cluster_loss(paths, T(inp["paths_dom_gap"]), present=(0, 1, 2)),
        "inter_every_id_gap": lambda: L.inter_cluster_loss(paths, T(inp["paths_dom_gap"]), present=(0, 1, 2)),
        "inter_every_id_gap_vector": lambda: L.inter_cluster_loss(paths, T(inp["paths_dom_gap"]), centroid="vector",
                                                                  present=(0, 1, 2)),
        "inter_every_id_one_domain": lambda: L.inter_cluster_loss(paths, T(np.full(12, 2, np.int64)),
                                                                  present=(0, 1, 2)),
        "ce_by_weights_gap": lambda: _ce_by_weights(logits, T(inp["ce_tgt_gap"]), T(inp["ce_dom_gap"]),
                                                    inp["offsets"]),
        "center": lambda: L.center_loss(T(inp["center_dist"]), T(inp["center_tgt"])),
        "ce": lambda: L.cross_entropy_per_domain(logits, cet, ced, inp["offsets"]),
        "ce_eps0_scale1": lambda: L.cross_entropy_per_domain(logits, cet, ced, inp["offsets"], 0.0, 1.0),
        "ce_gap": lambda: L.cross_entropy_per_domain(logits, T(inp["ce_tgt_gap"]), T(inp["ce_dom_gap"]),
                                                     inp["offsets"]),
        "ce_saturated": lambda: L.cross_entropy_per_domain([T(l) for l in inp["logits_saturated"]], cet, ced,
                                                           inp["offsets"], 0.0, 1.0),
        "ce_zero_logits": lambda: L.cross_entropy_per_domain([l * 0 for l in logits], cet, ced, inp["offsets"]),
    }


def _ce_by_weights(logits, targets, domains, offsets, epsilon=0.1, scale=0.5):
    """cross_entropy_per_domain's compiled-step form (every classifier weighted by its domain's presence), which
    it takes only while a graph is built; called op by op here."""
    from reid.losses.cross_entropy import _per_domain_by_weights
    return _per_domain_by_weights(logits, targets, domains, offsets, epsilon, scale)


def _objective_values(inp, c):
    """'case:term' -> value of reid.engine.objectives.objective (terms and 'total') for OBJECTIVE_CASES."""
    from reid.config import get_cfg
    from reid.engine.objectives import objective
    out = {}
    for name, (kind, num_splits, neck_feat, order) in OBJECTIVE_CASES.items():
        b = objective_batch(inp, order)
        cfg = get_cfg()
        cfg.MODEL.HEADS.NECK_FEAT = neck_feat
        model_out = {k: [c.as_tensor(l) for l in v] if k == "logits" else c.as_tensor(v)
                     for k, v in b.items() if k not in ("targets", "domains")}
        batch = {"targets": c.as_tensor(b["targets"]), "domains": c.as_tensor(b["domains"])}
        total, terms = objective(kind, model_out, batch, cfg, inp["offsets"], num_splits)
        out[name + ":total"] = float(c.to_numpy(total))
        out.update({"%s:%s" % (name, k): float(c.to_numpy(v)) for k, v in terms.items()})
    return out


def case_values(seed=0):
    import compat
    from reid import losses as L
    inp = make_inputs(seed)
    out = {name: float(compat.to_numpy(fn())) for name, fn in _loss_calls(inp, compat).items()}
    out.update(_objective_values(inp, compat))
    _, present = L.cross_entropy_per_domain([compat.as_tensor(l) for l in inp["logits"]],
                                            compat.as_tensor(inp["ce_tgt_gap"]), compat.as_tensor(inp["ce_dom_gap"]),
                                            inp["offsets"], return_present=True)
    out["ce_gap_present"] = list(present)
    out["normalize"] = compat.to_numpy(compat.normalize(compat.as_tensor(inp["cont_emb"]), 2, 1))
    return out


def _grad_setups(inp):
    """name -> (numpy inputs to differentiate, fn(list of tensors, T) -> scalar). Shared by both sides."""
    def L():
        from reid import losses
        return losses
    offs = inp["offsets"]
    return {
        "tri_cont": ([inp["cont_emb"]], lambda x, T: L().triplet_loss(x[0], T(inp["cont_tgt"]))),
        "tri_cont_soft": ([inp["cont_emb"]], lambda x, T: L().triplet_loss(x[0], T(inp["cont_tgt"]), margin=0.0)),
        "meta_mtrain_quant": ([inp["quant_emb"]],
                              lambda x, T: L().triplet_loss_meta(x[0], T(inp["quant_tgt"]), None, "mtrain")),
        "meta_add_quant": ([inp["quant_emb"]], lambda x, T: L().triplet_loss_meta(
            x[0], T(inp["quant_tgt"]), T(inp["quant_dom"]), "add")),
        "meta_add_cont": ([inp["cont_emb"]], lambda x, T: L().triplet_loss_meta(
            x[0], T(inp["cont_tgt"]), T(inp["cont_dom"]), "add")),
        "meta_tie": ([inp["tie_emb"]], lambda x, T: L().triplet_loss_meta(x[0], T(inp["tie_tgt"]), None, "mtest",
                                                                        margin=5.0)),
        "sct": ([inp["cont_emb"]], lambda x, T: L().domain_sct_loss(x[0], T(inp["quant_dom"]))),
        "cluster_scalar": ([inp["paths"]], lambda x, T: L().intra_cluster_loss(x[0], T(inp["paths_dom_single"]))
                           + L().inter_cluster_loss(x[0], T(inp["paths_dom_single"]), margin=0.5)),
        "cluster_vector": ([inp["paths"]], lambda x, T: L().intra_cluster_loss(
            x[0], T(inp["paths_dom_single"]), centroid="vector") + L().inter_cluster_loss(
            x[0], T(inp["paths_dom_single"]), margin=0.9, centroid="vector")),
        "center": ([inp["center_dist"]], lambda x, T: L().center_loss(x[0], T(inp["center_tgt"]))),
        "ce_gap": (list(inp["logits"]), lambda x, T: L().cross_entropy_per_domain(
            x, T(inp["ce_tgt_gap"]), T(inp["ce_dom_gap"]), offs)),
    }


# Gradients of the compiled steps' every-domain forms (domain 1 absent) next to the present-domain forms: equal
EVERY_ID_GRADS = {"sct_every_id_gap": "sct_gap", "cluster_every_id_gap": "cluster_gap",
                  "ce_by_weights_gap": "ce_gap"}


def _every_id_grad_setups(inp):
    from reid import losses as L
    gap = inp["paths_dom_gap"]

    def cluster(x, T, present=None):
        return (L.intra_cluster_loss(x[0], T(gap), present=present)
                + L.inter_cluster_loss(x[0], T(gap), margin=0.9, centroid="vector", present=present))
    return {
        "sct_gap": ([inp["cont_emb"]], lambda x, T: L.domain_sct_loss(x[0], T(gap))),
        "sct_every_id_gap": ([inp["cont_emb"]], lambda x, T: L.domain_sct_loss(x[0], T(gap), present=(0, 1, 2))),
        "cluster_gap": ([inp["paths"]], cluster),
        "cluster_every_id_gap": ([inp["paths"]], lambda x, T: cluster(x, T, (0, 1, 2))),
        "ce_by_weights_gap": (list(inp["logits"]), lambda x, T: _ce_by_weights(
            x, T(inp["ce_tgt_gap"]), T(inp["ce_dom_gap"]), inp["offsets"])),
    }


def case_grads(seed=0):
    import compat
    inp = make_inputs(seed)
    out = {}
    for name, (arrays, fn) in dict(_grad_setups(inp), **_every_id_grad_setups(inp)).items():
        params = [compat.nn.Parameter(compat.as_tensor(a)) for a in arrays]
        loss, _, grads = compat.value_and_grad(lambda *ps: fn(list(ps), compat.as_tensor), params)(*params)
        out[name] = dict(loss=float(compat.to_numpy(loss)), grads=[compat.to_numpy(g) for g in grads])
    return out


# ----------------------------------------------------------------- real-torch autograd references (loops)
def case_torch_reference(seed=0):
    """Loop-based versions of the original losses in real torch; returns values and input gradients."""
    import torch
    inp = make_inputs(seed)

    def euclid(x):
        xx = (x * x).sum(1, keepdim=True)
        return (xx + xx.t() - 2 * x @ x.t()).clamp(min=1e-12).sqrt()

    def triplet(x, pos, neg, margin):
        dist = euclid(x)
        ap = torch.stack([dist[i][pos[i]].max() for i in range(len(x))])
        an = torch.stack([dist[i][neg[i]].min() for i in range(len(x))])
        if margin > 0:
            return torch.relu(ap - an + margin).mean()
        return torch.nn.functional.soft_margin_loss(an - ap, torch.ones_like(an))

    def masks(tgt, dom, mode):
        tgt, dom = torch.as_tensor(tgt), torch.as_tensor(dom)
        same_id, same_dom = tgt[:, None] == tgt[None], dom[:, None] == dom[None]
        if mode == "add":
            return torch.eye(len(tgt), dtype=torch.bool) | ~same_dom, ~same_id & same_dom
        return same_id, ~same_id

    def sct(x, dom):
        f = x / (x.norm(dim=1, keepdim=True) + 1e-12)
        terms = []
        for d in np.unique(dom):
            fd = f[torch.as_tensor(dom == d)]
            c = fd.mean(0)
            terms.append((fd @ c / (fd.norm(dim=1) * c.norm())).mean())
        return torch.stack(terms).mean()

    def cluster(x, dom, vector, m_intra, m_inter):
        p = torch.nn.functional.normalize(x, 2, 1)
        intra, means = [], []
        for d in np.unique(dom):
            pd = p[torch.as_tensor(dom == d)]
            m = pd.mean(0) if vector else pd.mean()
            means.append(m)
            intra.append((torch.relu(torch.norm(pd - m, 2, 1) - m_intra) ** 2).mean())
        inter = [torch.relu(m_inter - torch.norm(means[i] - means[j], 2, 0)) ** 2
                 for i in range(len(means)) for j in range(i + 1, len(means))]
        return torch.stack(intra).mean() + torch.stack(inter).mean()

    def center(dist, tgt):
        mask = torch.as_tensor(tgt)[:, None] == torch.arange(dist.shape[1])[None]
        return (dist * mask.float()).clamp(1e-12, 1e12).sum() / dist.shape[0]

    def ce(logits, tgt, dom, offsets, eps=0.1, scale=0.5):
        terms = []
        for d in np.unique(dom):
            rows = torch.as_tensor(np.nonzero(dom == d)[0])
            lp = torch.log_softmax(logits[d][rows], 1)
            local = torch.as_tensor(tgt[rows.numpy()] - offsets[d])
            t = torch.full_like(lp, eps / (lp.shape[1] - 1))
            t[torch.arange(len(rows)), local] = 1 - eps
            per = (-t * lp).sum(1)
            terms.append(per.sum() / max(int((per != 0).sum()), 1) * scale)
        return sum(terms) / len(terms)

    fns = {
        "tri_cont": lambda x: triplet(x[0], *masks(inp["cont_tgt"], inp["cont_dom"], "mtrain"), 0.3),
        "tri_cont_soft": lambda x: triplet(x[0], *masks(inp["cont_tgt"], inp["cont_dom"], "mtrain"), 0.0),
        "meta_mtrain_quant": lambda x: triplet(x[0], *masks(inp["quant_tgt"], inp["quant_dom"], "mtrain"), 0.3),
        "meta_add_quant": lambda x: triplet(x[0], *masks(inp["quant_tgt"], inp["quant_dom"], "add"), 0.0),
        "meta_add_cont": lambda x: triplet(x[0], *masks(inp["cont_tgt"], inp["cont_dom"], "add"), 0.0),
        "meta_tie": lambda x: triplet(x[0], *masks(inp["tie_tgt"], inp["tie_tgt"], "mtest"), 5.0),
        "sct": lambda x: sct(x[0], inp["quant_dom"]),
        "cluster_scalar": lambda x: cluster(x[0], inp["paths_dom_single"], False, 0.1, 0.5),
        "cluster_vector": lambda x: cluster(x[0], inp["paths_dom_single"], True, 0.1, 0.9),
        "center": lambda x: center(x[0], inp["center_tgt"]),
        "ce_gap": lambda x: ce(x, inp["ce_tgt_gap"], inp["ce_dom_gap"], inp["offsets"]),
    }
    out = {}
    for name, (arrays, _) in _grad_setups(inp).items():
        xs = [torch.tensor(a, requires_grad=True) for a in arrays]
        loss = fns[name](xs)
        grads = torch.autograd.grad(loss, xs, allow_unused=True)
        out[name] = dict(loss=float(loss), grads=[np.zeros_like(a) if g is None else g.numpy()
                                                  for a, g in zip(arrays, grads)])
    return out


# -------------------------------------------------------------------------- numpy references (float64)
def np_euclid(x):
    x = x.astype(np.float64)
    d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    return np.sqrt(np.maximum(d2, 1e-12))


def np_cosine_dist(x):
    f = x.astype(np.float64) / np.maximum(np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True), 1e-12)
    return 2 - 2 * f @ f.T


def np_ranking(ap, an, margin):
    if margin > 0:
        return float(np.mean(np.maximum(ap - an + margin, 0)))
    with np.errstate(over="ignore"):
        overflow = np.isinf(np.exp((ap - an).astype(np.float32))).any()  # the original's float32 inf check
    if overflow:
        return float(np.mean(np.maximum(ap - an + 0.3, 0)))
    return float(np.mean(np.log1p(np.exp(ap - an))))


def np_triplet(x, tgt, dom=None, mode="basic", margin=0.3, hard=True, dist=None):
    dist = np_euclid(x) if dist is None else dist
    n = len(tgt)
    ap, an = np.zeros(n), np.zeros(n)
    for i in range(n):
        if mode == "add":
            pos = np.array([j == i or dom[j] != dom[i] for j in range(n)])
            neg = np.array([tgt[j] != tgt[i] and dom[j] == dom[i] for j in range(n)])
        else:
            pos = np.array([tgt[j] == tgt[i] for j in range(n)])
            neg = ~pos
        if hard:
            ap[i] = dist[i][pos].max()
            an[i] = dist[i][neg].min() if neg.any() else 1e9
        else:  # fast-reid softmax_weights: max over the masked row (zeros included), +1e-6 in the partition
            dp, dn = dist[i] * pos, dist[i] * neg
            ep = np.exp(dp - (dp * pos).max()) * pos
            en = np.exp(-dn - (-dn * neg).max()) * neg
            ap[i] = (dp * ep / (ep.sum() + 1e-6)).sum()
            an[i] = (dn * en / (en.sum() + 1e-6)).sum()
    return np_ranking(ap, an, margin)


def np_sct(x, dom, norm_feat=True):
    x = x.astype(np.float64)
    f = x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-12) if norm_feat else x
    terms = []
    for d in np.unique(dom):
        fd = f[dom == d]
        c = fd.mean(0)
        terms.append(np.mean([fi @ c / (np.linalg.norm(fi) * np.linalg.norm(c)) for fi in fd]))
    return float(np.mean(terms))


def np_cluster_means(paths, dom, vector):
    p = paths.astype(np.float64)
    p = p / np.maximum(np.linalg.norm(p, axis=1, keepdims=True), 1e-12)
    return p, [(d, p[dom == d].mean(0) if vector else p[dom == d].mean()) for d in np.unique(dom)]


def np_intra(paths, dom, margin=0.1, vector=False):
    p, means = np_cluster_means(paths, dom, vector)
    terms = []
    for d, m in means:
        terms.append(np.mean([max(np.linalg.norm(pi - m) - margin, 0) ** 2 for pi in p[dom == d]]))
    return float(np.mean(terms))


def np_inter(paths, dom, margin=0.3, vector=False):
    _, means = np_cluster_means(paths, dom, vector)
    if len(means) < 2:
        return float(np.mean(dom))
    terms = [max(margin - np.linalg.norm(np.atleast_1d(means[i][1] - means[j][1])), 0) ** 2
             for i in range(len(means)) for j in range(i + 1, len(means))]
    return float(np.mean(terms))


def np_center(dist, tgt):
    n, c = dist.shape
    total = 0.0
    for i in range(n):
        for k in range(c):
            total += min(max(float(dist[i, k]) if k == tgt[i] else 0.0, 1e-12), 1e12)
    return total / n


def np_ce(logits, tgt, dom, offsets, eps=0.1, scale=0.5):
    terms = []
    for d in np.unique(dom):
        rows = np.nonzero(dom == d)[0]
        per = []
        for r in rows:
            z = logits[d][r].astype(np.float64)
            lp = z - z.max() - np.log(np.exp(z - z.max()).sum())
            c = len(z)
            t = np.full(c, eps / (c - 1)) if c > 1 else np.zeros(c)
            t[tgt[r] - offsets[d]] = 1 - eps
            per.append(-(t * lp).sum())
        per = np.array(per)
        terms.append(per.sum() / max(np.count_nonzero(per), 1) * scale)
    return float(np.mean(terms))


def np_chunks(n, k):
    s = n // k
    return [slice(i * s, (i + 1) * s) for i in range(k)]


def np_objective(kind, b, num_splits, neck_feat, offsets):
    """The ACL step objectives with the default weights, each term averaged over contiguous chunks (the
    original's 4-GPU DataParallel), plus their sum as 'total'."""
    f = b["feat_norm"] if neck_feat == "after" else b["features"]
    terms = {}
    for s in np_chunks(len(f), num_splits):
        t, d, paths = b["targets"][s], b["domains"][s], b["paths"][s]
        part = {}
        if kind == "basic":
            part["loss_cls"] = np_ce([l[s] for l in b["logits"]], t, d, offsets, 0.1, 0.5)
            part["loss_triplet"] = np_triplet(f[s], t)
            part["loss_center"] = np_center(b["center_dist"][s], t) * 5e-4
        elif kind == "mtrain":
            part["loss_triplet_add"] = np_triplet(f[s], t, d, "add", margin=0.0)
            part["loss_triplet_mtrain"] = np_triplet(f[s], t, d, "mtrain")
            part["loss_sct"] = np_sct(f[s], d)
        else:
            part["loss_triplet_mtest"] = np_triplet(f[s], t, d, "mtest")
            part["loss_center"] = np_center(b["center_dist"][s], t) * 1e-3
        part["loss_intra"] = np_intra(paths, d, 0.1)
        part["loss_inter"] = np_inter(paths, d, 0.3)
        for k, v in part.items():
            terms[k] = terms.get(k, 0.0) + v / num_splits
    terms["total"] = sum(terms.values())
    return terms


def reference_values(inp):
    ce_emb, ct, cd = inp["cont_emb"], inp["cont_tgt"], inp["cont_dom"]
    qe, qt, qd = inp["quant_emb"], inp["quant_tgt"], inp["quant_dom"]
    paths, logits, offs = inp["paths"], inp["logits"], inp["offsets"]
    cet, ced = inp["ce_tgt"], inp["ce_dom"]
    ref = {
        "tri_cont": np_triplet(ce_emb, ct),
        "tri_cont_soft": np_triplet(ce_emb, ct, margin=0.0),
        "tri_cont_cos": np_triplet(ce_emb, ct, dist=np_cosine_dist(ce_emb)),
        "tri_quant": np_triplet(qe, qt),
        "tri_quant_soft": np_triplet(qe, qt, margin=0.0),
        "tri_quant_weighted": np_triplet(qe, qt, hard=False),
        "tri_no_negative": 0.0,  # every row's negative distance is the 1e9 sentinel
        "tri_overflow": np_triplet(ce_emb * 200, ct, margin=0.0),
        "meta_mtrain_cont": np_triplet(ce_emb, ct, cd, "mtrain"),
        "meta_mtest_quant": np_triplet(qe, qt, qd, "mtest"),
        "meta_add_cont": np_triplet(ce_emb, ct, cd, "add", margin=0.0),
        "meta_add_quant": np_triplet(qe, qt, qd, "add", margin=0.0),
        "meta_add_one_domain": np_triplet(qe[:6], qt[:6], qd[:6], "add", margin=0.0),
        "meta_mtrain_weighted": np_triplet(qe, qt, qd, "mtrain", hard=False),
        "meta_add_normfeat": np_triplet(ce_emb / (np.linalg.norm(ce_emb.astype(np.float64), axis=1,
                                                                 keepdims=True) + 1e-12), ct, cd, "add", margin=0.0),
        "sct_cont": np_sct(ce_emb, cd),
        "sct_quant": np_sct(qe, qd),
        "sct_one_domain": np_sct(qe[:6], qd[:6]),
        "sct_raw": np_sct(ce_emb, cd, norm_feat=False),
        "intra_scalar": np_intra(paths, cd),
        "intra_vector": np_intra(paths, cd, vector=True),
        "intra_gap": np_intra(paths, inp["paths_dom_gap"]),
        "intra_single_scalar": np_intra(paths, inp["paths_dom_single"]),
        "intra_single_vector": np_intra(paths, inp["paths_dom_single"], vector=True),
        "inter_scalar": np_inter(paths, cd),
        "inter_vector": np_inter(paths, cd, vector=True),
        "inter_gap": np_inter(paths, inp["paths_dom_gap"]),
        "inter_gap_vector": np_inter(paths, inp["paths_dom_gap"], vector=True),
        "inter_one_domain": 2.0,  # the original's fall-back: domain_ids.float().mean()
        "sct_every_id_gap": np_sct(ce_emb, inp["paths_dom_gap"]),
        "sct_every_id_one_domain": np_sct(qe[:6], qd[:6]),
        "intra_every_id_gap": np_intra(paths, inp["paths_dom_gap"]),
        "inter_every_id_gap": np_inter(paths, inp["paths_dom_gap"]),
        "inter_every_id_gap_vector": np_inter(paths, inp["paths_dom_gap"], vector=True),
        "inter_every_id_one_domain": 2.0,
        "center": np_center(inp["center_dist"], inp["center_tgt"]),
        "ce": np_ce(logits, cet, ced, offs),
        "ce_eps0_scale1": np_ce(logits, cet, ced, offs, 0.0, 1.0),
        "ce_gap": np_ce(logits, inp["ce_tgt_gap"], inp["ce_dom_gap"], offs),
        "ce_saturated": np_ce(inp["logits_saturated"], cet, ced, offs, 0.0, 1.0),
        "ce_zero_logits": float(np.mean([0.5 * np.log(w) for w in inp["widths"]])),  # CE of uniform = log C
        "ce_by_weights_gap": np_ce(logits, inp["ce_tgt_gap"], inp["ce_dom_gap"], offs),
    }
    for name, (kind, num_splits, neck_feat, order) in OBJECTIVE_CASES.items():
        terms = np_objective(kind, objective_batch(inp, order), num_splits, neck_feat, offs)
        ref.update({"%s:%s" % (name, k): v for k, v in terms.items()})
    return ref


# --------------------------------------------------------------------------------------------- tests
_CACHE = {}


def results(backend):
    """Values and gradients computed by `backend` (one process), plus the real-torch references."""
    if backend not in _CACHE:
        calls = [(HERE + ":case_values", {}), (HERE + ":case_grads", {})]
        if backend == "torch":
            calls.append((HERE + ":case_torch_reference", {}))
        _CACHE[backend] = run_cases(backend, calls)
    return _CACHE[backend]


def _param(backend, needs=()):
    """Parity-marked when it needs an environment other than the running one."""
    envs = {backend, *needs}
    return pytest.param(backend, marks=[pytest.mark.parity] if envs - {ACTIVE} else [], id=backend)


def test_reference_sanity():
    """The references themselves: edge cases behave as the definitions say."""
    inp = make_inputs()
    # the overflow case really overflows float32 and falls back to margin 0.3
    assert np_triplet(inp["cont_emb"] * 200, inp["cont_tgt"], margin=0.0) == \
        np_triplet(inp["cont_emb"] * 200, inp["cont_tgt"], margin=0.3)
    # the saturated CE row has an exactly-zero loss, so the divisor differs from the row count
    assert np_ce(inp["logits_saturated"], inp["ce_tgt"], inp["ce_dom"], inp["offsets"], 0.0, 1.0) != \
        np_ce(inp["logits"], inp["ce_tgt"], inp["ce_dom"], inp["offsets"], 0.0, 1.0)
    # scalar and vector centroids give different losses; mode 'add' differs from 'mtrain'
    assert abs(np_intra(inp["paths"], inp["cont_dom"]) - np_intra(inp["paths"], inp["cont_dom"], vector=True)) > 1e-3
    assert abs(np_triplet(inp["quant_emb"], inp["quant_tgt"], inp["quant_dom"], "add", margin=0.3)
               - np_triplet(inp["quant_emb"], inp["quant_tgt"], inp["quant_dom"], "mtrain")) > 1e-3
    # the objective cases can tell chunked from whole-batch triplet mining, and NECK_FEAT before from after
    b = objective_batch(inp, "paired")
    for kind, key in (("basic", "loss_triplet"), ("mtest", "loss_triplet_mtest")):
        whole, split = (np_objective(kind, b, n, "after", inp["offsets"]) for n in (1, 2))
        before = np_objective(kind, b, 1, "before", inp["offsets"])
        assert abs(whole[key] - split[key]) > 0.1 and abs(whole[key] - before[key]) > 0.1


@pytest.mark.parametrize("backend", [_param(b) for b in BACKENDS])
def test_values_match_loop_reference(backend):
    got = results(backend)[0]
    ref = reference_values(make_inputs())
    bad = {k: (got[k], ref[k]) for k in ref if not np.isclose(got[k], ref[k], rtol=1e-5, atol=1e-5)}
    assert not bad, bad
    assert got["ce_gap_present"] == [0, 2]
    inp = make_inputs()
    expected = inp["cont_emb"] / np.linalg.norm(inp["cont_emb"], axis=1, keepdims=True)
    np.testing.assert_allclose(got["normalize"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", [_param(b, needs=("torch",)) for b in BACKENDS])
def test_grads_match_torch_autograd(backend):
    got = results(backend)[1]
    ref = results("torch")[2]
    for name in ref:
        assert np.isclose(got[name]["loss"], ref[name]["loss"], rtol=1e-5, atol=1e-5), (name, got[name]["loss"],
                                                                                         ref[name]["loss"])
        for g, r in zip(got[name]["grads"], ref[name]["grads"]):
            assert np.all(np.isfinite(g)), name
            # relative to each gradient's own scale (they range from 1e-2 to 1 across cases; float32 rounding
            # measured at <= 4e-6 of the largest entry): a fixed atol would hide a wrong small gradient
            scale = float(np.abs(r).max())
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=2e-5 * scale + 1e-12, err_msg=name)
            assert np.linalg.norm(g - r) <= 2e-5 * np.linalg.norm(r) + 1e-12, name
    # an absent domain's classifier gets no gradient
    assert not np.any(got["ce_gap"]["grads"][1]) and np.all(np.any(got["ce_gap"]["grads"][0], axis=1) ==
                                                            (make_inputs()["ce_dom_gap"] == 0))
    # tied hardest negatives (duplicated rows 2, 3) share the gradient evenly, as the original's per-row min did
    tie = got["meta_tie"]["grads"][0]
    assert np.any(tie[2]) and np.allclose(tie[2], tie[3], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("backend", [_param(b) for b in BACKENDS])
def test_every_domain_forms_have_the_present_domain_gradients(backend):
    """The compiled steps' losses (every source domain, weighted by presence) give the gradients of the losses
    over the present domains, op by op here, with a domain absent: finite, and equal to float32 rounding."""
    got = results(backend)[1]
    for every, present in EVERY_ID_GRADS.items():
        assert got[every]["loss"] == pytest.approx(got[present]["loss"], rel=1e-6, abs=1e-7), every
        assert any(np.any(r) for r in got[present]["grads"]), present
        for g, r in zip(got[every]["grads"], got[present]["grads"]):  # (the absent domain's classifier: zeros)
            assert np.all(np.isfinite(g)), every
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6 * float(np.abs(r).max()) + 1e-9, err_msg=every)


@pytest.mark.parity
def test_backends_agree():
    ms, th = results("mindspore"), results("torch")
    for key, value in th[0].items():
        np.testing.assert_allclose(ms[0][key], value, rtol=1e-5, atol=1e-5, err_msg=key)


# ---------------------------------------------------------------------- bad input (active backend only)
def test_bad_input_raises_user_error():
    import compat
    from compat.errors import UserError
    from reid import losses as L
    T = compat.as_tensor
    inp = make_inputs()
    emb = T(inp["cont_emb"])
    with pytest.raises(UserError, match="no negative"):  # one id per domain: 'add' has no negatives
        L.triplet_loss_meta(emb, T(inp["cont_dom"]), T(inp["cont_dom"]), "add")
    with pytest.raises(UserError, match="no negative"):
        L.triplet_loss_meta(emb, T(np.zeros(12, np.int64)), None, "mtrain")
    with pytest.raises(UserError, match="needs the domain"):
        L.triplet_loss_meta(emb, T(inp["cont_tgt"]), None, "add")
    with pytest.raises(UserError, match="mode"):
        L.triplet_loss_meta(emb, T(inp["cont_tgt"]), None, "meta")
    from reid.config import get_cfg
    from reid.engine.objectives import objective
    b = objective_batch(inp, "paired")
    out = {k: [T(l) for l in v] if k == "logits" else T(v) for k, v in b.items() if k not in ("targets", "domains")}
    batch = {"targets": T(b["targets"]), "domains": T(b["domains"])}
    with pytest.raises(UserError, match="NUM_SPLITS"):
        objective("basic", out, batch, get_cfg(), inp["offsets"], 5)
    cfg = get_cfg()
    cfg.MODEL.HEADS.NECK_FEAT = "middle"
    with pytest.raises(UserError, match="NECK_FEAT must be one of after, before"):
        objective("basic", out, batch, cfg, inp["offsets"], 2)
    with pytest.raises(UserError, match="relabelled"):
        L.cross_entropy_per_domain([T(l) for l in inp["logits"]], T(inp["ce_tgt"] + 1), T(inp["ce_dom"]),
                                   inp["offsets"])
    with pytest.raises(UserError, match="labels must lie"):
        L.center_loss(T(inp["center_dist"]), T(inp["center_tgt"] + 13))
    with pytest.raises(UserError, match="CENTROID"):
        L.intra_cluster_loss(T(inp["paths"]), T(inp["cont_dom"]), centroid="median")


# ---------------------------------------------------------------------- chance level (curves.png)
def test_classification_chance_is_the_loss_of_uniform_predictions():
    """The dashed chance line of curves.png equals loss_cls when every classifier outputs equal logits (label
    smoothing included), for the demo's equal class counts and for unequal ones with every domain present."""
    import compat
    from reid import losses as L
    from reid.config import get_cfg
    from reid.engine.hooks import classification_chance
    cfg = get_cfg()
    for classes in ([150, 150, 150], [5, 3, 4]):
        cfg.MODEL.HEADS.NUM_CLASSES = classes
        offsets = np.cumsum([0] + classes[:-1])
        domains = np.repeat(np.arange(3), 4)
        targets = offsets[domains] + np.arange(12) % 3
        logits = [compat.as_tensor(np.full((12, n), 0.7, np.float32)) for n in classes]
        loss = L.cross_entropy_per_domain(logits, compat.as_tensor(targets), compat.as_tensor(domains), list(offsets),
                                          cfg.MODEL.LOSSES.CE.EPSILON, cfg.MODEL.LOSSES.CE.SCALE)
        assert abs(float(compat.to_numpy(loss)) - classification_chance(cfg)) < 1e-5
    cfg.MODEL.HEADS.NUM_CLASSES = [150, 150, 150]
    assert abs(classification_chance(cfg) - 0.5 * np.log(150)) < 1e-12
