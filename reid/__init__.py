"""acl-reid: ACL (ECCV 2022) domain-generalizable person re-identification in torch-style code.

The torch API comes from `compat`, which runs it on MindSpore (mindnlp's mindtorch)
or on PyTorch.
"""
__version__ = "0.1.0"
