"""Training: the ACL trainer (basic + meta steps), its objectives, hooks, checkpoints and logs."""
