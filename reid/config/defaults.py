"""Default configuration: the full-size ACL setup of the original (Protocol-2, M+MS+CS -> CUHK03).

Values and their meaning follow docs/method.md (recipe: #recipe). Configs in configs/
override them; the command line overrides those.
"""
from yacs.config import CfgNode as CN

_C = CN()
_C.SEED = 0                       # global seed (numpy, python, backend, samplers); the original used a random one
_C.OUTPUT_DIR = "output/acl_protocol2_cuhk03"
# Where the feature extractor (reid.deploy, tools/index.py, tools/search.py) keeps what it makes once per model
# and reuses: the files it exports from weights (deploy/) and its compiled graphs (compile_cache/).
# "" = $REID_CACHE, else $XDG_CACHE_HOME/acl-reid, else ~/.cache/acl-reid.
_C.CACHE_DIR = ""

# ----------------------------------------------------------------------------- model
_C.MODEL = CN()
_C.MODEL.META_ARCHITECTURE = "ACL"   # registry name: "ACL" or "Baseline" (bag of tricks)
_C.MODEL.DEVICE = "cpu"              # cpu | gpu | ascend
_C.MODEL.WEIGHTS = ""                # checkpoint to start from / evaluate
_C.MODEL.PIXEL_MEAN = [123.675, 116.28, 103.53]   # ImageNet mean * 255 (inputs are 0..255)
_C.MODEL.PIXEL_STD = [58.395, 57.12, 57.375]
# Emulate the original's nn.DataParallel over 4 GPUs: BN statistics and losses per contiguous chunk
# (docs/method.md#dataparallel). 1 = whole-batch semantics.
_C.MODEL.NUM_SPLITS = 4
# With NUM_SPLITS > 1, op by op: True runs one forward per chunk, as DataParallel's replicas do (the kernels see
# a chunk, so a data-parallel run's ranks compute the same); False one forward over the whole batch with
# per-chunk BN statistics (the same function, rounded differently; compiled steps always do this). True costs
# nothing at full size and several times a MindSpore step at demo width (docs/performance.md#other).
_C.MODEL.CHUNK_FORWARDS = True
# MindSpore: compiled training steps (static graphs, compat/jit.py; each built on first use); False: op by op,
# the slower path that needs more memory at full size (docs/performance.md#compiled-execution). On torch it
# does nothing.
_C.MODEL.JIT = True
# With MODEL.JIT and META.ENABLED: the basic and meta-train steps share one graph (both objectives computed, each
# weighted 1 or 0; the running statistics put back after meta-train steps), the meta-test step has its own. One
# graph fewer to build and to hold (each step graph keeps its convolutions' buffers; docs/performance.md#ratios);
# False: a graph per step kind.
_C.MODEL.JIT_SHARED_GRAPH = True
# MindSpore: where the compiled evaluation graph (TEST.JIT) is kept, so that a later run (train.py or test.py) with
# the same code, model config and batch shape loads it instead of building it again: "" = OUTPUT_DIR/compile_cache,
# "off" = none. MindSpore cannot cache MODEL.JIT's step graphs (docs/performance.md#compiled-execution).
_C.MODEL.COMPILE_CACHE = ""
_C.MODEL.NUM_THREADS = 0              # MindSpore CPU kernel threads; 0 = env REID_NUM_THREADS, else one per core
# MindSpore: built graphs (MODEL.JIT, TEST.JIT) run on a helper thread at the lowest CPU priority while the calling
# thread sleeps. MindSpore spin-waits in the thread that waits for a graph, which on few cores takes CPU from the
# graph's kernel threads (docs/performance.md#compiled-execution). False: on the calling thread.
_C.MODEL.JIT_HELPER_THREAD = True

_C.MODEL.BACKBONE = CN()
_C.MODEL.BACKBONE.NAME = "acl_resnet50_ibn_a"   # or "resnet50", "resnet50_ibn_a" (baseline)
_C.MODEL.BACKBONE.BASE_WIDTH = 64                # stem width; 64 is ResNet-50, smaller runs on CPU
# Bottleneck blocks per stage, as fast-reid's DEPTH: "50x" = 3/4/6/3 (ResNet-50, the original), "101x" = 3/4/23/3,
# "26x" = 2/2/2/2. ACL turns each stage's last block into its CODE block (50x: main stages 2/3/5/2). Shallower
# means smaller compiled graphs, built in less time; ImageNet weights (PRETRAIN) exist for 50x only.
_C.MODEL.BACKBONE.DEPTH = "50x"
_C.MODEL.BACKBONE.LAST_STRIDE = 1
_C.MODEL.BACKBONE.WITH_IBN = True
_C.MODEL.BACKBONE.NUM_EXPERTS = 4                # K, dynamic-branch experts per CODE block
_C.MODEL.BACKBONE.PRETRAIN = False               # load ImageNet ResNet-50-IBN-a weights from PRETRAIN_PATH
_C.MODEL.BACKBONE.PRETRAIN_PATH = ""             # e.g. ~/.cache/torch/checkpoints/resnet50_ibn_a-d9d0bb7b.pth
_C.MODEL.BACKBONE.ADAPTOR_STEP_RATIO = 0.5       # r: fast-weight step ratio for modules named *adaptor*
# True: the last BN of every stage bottleneck starts at scale 0, so each residual block starts as the identity
# (Goyal et al. 2017). Not the original's init (it loads ImageNet weights); from scratch (the synthetic demo)
# it ends a long plateau at chance (docs/demo.md). Pretrained weights overwrite it.
_C.MODEL.BACKBONE.ZERO_INIT_RESIDUAL = False
# True: the CODE blocks' residual branches start at zero too (the static branch's last instance-norm scale and
# every expert's bn3 scale), so each CODE block starts as a normalised copy of its input. Not the original's init;
# from scratch it lifts ACL to the plain ResNet's pace (docs/demo.md). Backbones without CODE blocks ignore it.
_C.MODEL.BACKBONE.ZERO_INIT_CODE = False

_C.MODEL.HEADS = CN()
_C.MODEL.HEADS.NAME = "MetaEmbeddingHead"
_C.MODEL.HEADS.POOL_LAYER = "gem"                # GeM with p fixed at 3
_C.MODEL.HEADS.GEM_P = 3.0
_C.MODEL.HEADS.NECK_FEAT = "after"               # metric-loss feature: "after" BNNeck (normalised) or "before"
_C.MODEL.HEADS.SCALE = 1.0
_C.MODEL.HEADS.NUM_CLASSES = [11934, 751, 1041]  # per source domain, set from the datasets at train time

_C.MODEL.LOSSES = CN()
_C.MODEL.LOSSES.CE = CN()
_C.MODEL.LOSSES.CE.EPSILON = 0.1
_C.MODEL.LOSSES.CE.SCALE = 0.5
_C.MODEL.LOSSES.TRI = CN()
_C.MODEL.LOSSES.TRI.MARGIN = 0.3
_C.MODEL.LOSSES.TRI.SCALE = 1.0
_C.MODEL.LOSSES.CENTER = CN()
_C.MODEL.LOSSES.CENTER.SCALE = 5e-4              # basic step
_C.MODEL.LOSSES.CENTER.META_SCALE = 1e-3         # meta-test step
_C.MODEL.LOSSES.CLUSTER = CN()
_C.MODEL.LOSSES.CLUSTER.ENABLED = True
_C.MODEL.LOSSES.CLUSTER.INTRA_MARGIN = 0.1
_C.MODEL.LOSSES.CLUSTER.INTER_MARGIN = 0.3
_C.MODEL.LOSSES.CLUSTER.CENTROID = "scalar"      # "scalar" (the original's behaviour) or "vector" (per-dimension)
_C.MODEL.LOSSES.SCT = CN()
_C.MODEL.LOSSES.SCT.SCALE = 1.0

# ----------------------------------------------------------------------------- input / augmentation
_C.INPUT = CN()
_C.INPUT.SIZE_TRAIN = [256, 128]     # H, W
_C.INPUT.SIZE_TEST = [256, 128]
_C.INPUT.FLIP = CN({"ENABLED": True, "PROB": 0.5})
_C.INPUT.PADDING = CN({"ENABLED": True, "SIZE": 10})
_C.INPUT.CJ = CN({"ENABLED": True, "PROB": 0.5, "BRIGHTNESS": 0.15, "CONTRAST": 0.15, "SATURATION": 0.1, "HUE": 0.1})
# random white balance (reid/data/transforms.py CastJitter; not in the original): per-channel gains exp(N(0, STD))
# normalised to geometric mean 1, on PROB of the training images
_C.INPUT.CAST = CN({"ENABLED": False, "PROB": 0.5, "STD": 0.15})
_C.INPUT.AUTOAUG = CN({"ENABLED": True, "PROB": 0.1})
_C.INPUT.REA = CN({"ENABLED": False, "PROB": 0.5, "VALUE": [123.675, 116.28, 103.53],
                   "SCALE": [0.02, 0.33], "RATIO": [0.3, 3.3]})   # erased area fraction, aspect (torchvision)

# ----------------------------------------------------------------------------- datasets
_C.DATASETS = CN()
_C.DATASETS.ROOT = "datasets"        # or the REID_DATA environment variable
_C.DATASETS.NAMES = ["CUHKSYSU", "Market1501", "MSMT17"]   # source domains, in domain-id order
_C.DATASETS.TESTS = ["CUHK03"]
_C.DATASETS.COMBINEALL = False       # Protocol-3: train on train+test of the sources
_C.DATASETS.CUHK03_LABELED = True
_C.DATASETS.CUHK03_SPLIT = 0         # CUHK03-NP has a single split
_C.DATASETS.ON_BAD_IMAGE = "stop"    # "stop" | "skip": what a corrupt/unreadable image does
_C.DATASETS.SYNTHETIC = CN()
_C.DATASETS.SYNTHETIC.SEED = 0
_C.DATASETS.SYNTHETIC.NUM_IDS = 300  # identities per synthetic domain
# Your own labelled datasets (docs/datasets.md#your-own-data), one entry per name: DATASETS.CUSTOM.<Name>.ROOT, a
# folder in Market-1501 layout and naming, or DATASETS.CUSTOM.<Name>.CSV, a list of path,pid,camid[,split] rows
# (relative paths are under the data root). <Name> then goes in NAMES / TESTS like a built-in name. Entries are
# added by the config file or the command line; each gets the keys of CUSTOM_DATASET.
_C.DATASETS.CUSTOM = CN()
CUSTOM_DATASET = CN({"ROOT": "", "CSV": ""})

# ----------------------------------------------------------------------------- loader
_C.DATALOADER = CN()
_C.DATALOADER.SAMPLER_TRAIN = "NaiveIdentitySampler"   # the only sampler implemented
_C.DATALOADER.NUM_INSTANCE = 2
_C.DATALOADER.NUM_WORKERS = 2

# ----------------------------------------------------------------------------- solver
_C.SOLVER = CN()
_C.SOLVER.OPT = "SGD"                # the only optimizer implemented (both the basic and the meta one)
_C.SOLVER.BASE_LR = 0.04
_C.SOLVER.MOMENTUM = 0.9
_C.SOLVER.META_MOMENTUM = 0.0
_C.SOLVER.NESTEROV = False
_C.SOLVER.WEIGHT_DECAY = 5e-4
_C.SOLVER.WEIGHT_DECAY_NORM = 5e-4
_C.SOLVER.WEIGHT_DECAY_BIAS = 5e-4
_C.SOLVER.BIAS_LR_FACTOR = 1.0
_C.SOLVER.HEADS_LR_FACTOR = 1.0
_C.SOLVER.IMS_PER_BATCH = 64
_C.SOLVER.MAX_EPOCH = 60
_C.SOLVER.ITERS_PER_EPOCH = 0        # 0: len(combined train set) // IMS_PER_BATCH
_C.SOLVER.SCHED = "CosineAnnealingLR"   # or "MultiStepLR"
_C.SOLVER.ETA_MIN_LR = 4e-5
_C.SOLVER.STEPS = [30, 50]
_C.SOLVER.GAMMA = 0.1
_C.SOLVER.WARMUP_METHOD = "linear"
_C.SOLVER.WARMUP_FACTOR = 0.01
_C.SOLVER.WARMUP_EPOCHS = 10
_C.SOLVER.CLIP_GRADIENTS = CN({"ENABLED": False, "MAX_NORM": 5.0})
# An exponential moving average of the weights and BN running statistics, which the evaluations score instead
# of the last weights (reid/engine/hooks.py WeightAverage; not in the original). DECAY per iteration (horizon
# about 1 / (1 - DECAY) iterations), from iteration START_ITER, updated every PERIOD iterations.
_C.SOLVER.EMA = CN({"ENABLED": False, "DECAY": 0.99, "START_ITER": 0, "PERIOD": 1})
_C.SOLVER.CHECKPOINT_PERIOD = 5      # epochs between model_XXXX.pth checkpoints (kept)
# Iterations between model_iter_XXXXXXX.pth checkpoints (only the newest is kept; 0: none), so that a crash
# in a long epoch loses little: 200 is a sixth of a full-size Protocol-2 -> CUHK03 epoch (1,214 iterations).
_C.SOLVER.CHECKPOINT_ITERS = 200

# ----------------------------------------------------------------------------- meta-learning (ACL)
_C.META = CN()
_C.META.ENABLED = True
_C.META.PERIOD = 3                   # a meta step every PERIOD iterations
_C.META.INITIAL_BASIC_STEPS = 10     # basic steps at iteration 0
_C.META.IMS_PER_DOMAIN = 32          # meta-train batch per domain and meta-test batch

# ----------------------------------------------------------------------------- test
_C.TEST = CN()
_C.TEST.EVAL_PERIOD = 5              # epochs
_C.TEST.EVAL_AT_START = False        # also evaluate the untrained model (a reference point for the curves)
_C.TEST.IMS_PER_BATCH = 128
_C.TEST.JIT = True                   # MindSpore: compiled evaluation forward (one graph per model); False: op by op
_C.TEST.METRIC = "cosine"            # or "euclidean"
_C.TEST.FLIP = False
_C.TEST.METRIC_CUHK03 = False        # CUHK03 single-shot protocol instead of Market-style
_C.TEST.RERANK = CN({"ENABLED": False, "K1": 20, "K2": 6, "LAMBDA": 0.3})
_C.TEST.AQE = CN({"ENABLED": False, "QE_TIME": 1, "QE_K": 5, "ALPHA": 3.0})
_C.TEST.MAX_RANK = 50
# "histogram": also evaluate the hand-crafted HSV colour-histogram feature (no learning) on every target and
# print it next to the network (reid/evaluation/histogram.py); "" for none
_C.TEST.REFERENCE = ""

# ----------------------------------------------------------------------------- logging
_C.LOG_PERIOD = 20                   # iterations between metrics.json records

