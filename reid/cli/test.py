"""Evaluate trained weights on the configured target domain(s).

    acl-reid-test --config-file output/synthetic/acl/config.yaml MODEL.WEIGHTS output/synthetic/acl/model_final.pth
        [--backend torch] [--vis-rank 8] [--reference histogram] [KEY VALUE ...]
    acl-reid-test --config-file configs/synthetic/acl.yml --reference histogram     (the reference alone)
    acl-reid-test --config-file output/synthetic/acl/config.yaml --engine onnx --model model.onnx
        (an exported file from tools/export.py: onnxruntime for ONNX, MindSpore GraphCell for MINDIR)
    (in a checkout, also: python test.py ...)
"""
from reid.engine.launch import parse_args, setup_cfg, test


def main(argv=None):
    args = parse_args(__doc__, training=False, argv=argv)
    test(setup_cfg(args), vis_rank=args.vis_rank, reference_only=bool(args.reference), engine=args.engine,
         model_path=args.model)


if __name__ == "__main__":
    main()
