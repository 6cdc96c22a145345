"""The training loop and its hooks, kept apart from what one iteration does.

`TrainLoop.train(start_iter, end_iter)` calls, in order, every registered hook's `before_train()`, then for
each iteration `before_step()`, the subclass's `run_step()`, `after_step()`, and finally `after_train()`
(also when an iteration raised, so logs are flushed and progress bars closed). Hooks see the loop as
`self.trainer`; what the steps measured they read from `trainer.storage` (an `EventStorage`, whose scalars
carry the iteration they belong to), and what they produce themselves they keep on the hook.
"""
from reid.engine.events import EventStorage


class HookBase:
    """Override what you need; `self.trainer` is set when the hook is registered."""
    trainer = None

    def before_train(self):
        pass

    def before_step(self):
        pass

    def after_step(self):
        pass

    def after_train(self):
        pass


class TrainLoop:
    """Iterations `start_iter .. end_iter - 1` of `run_step()`, with hooks around them.

    `iter` is the iteration being run (during `after_train`: the last one started); it is also the
    storage's current iteration, so a scalar put without an explicit iteration belongs to it."""

    def __init__(self):
        self.storage = EventStorage()
        self._hooks = []
        self.start_iter = 0

    @property
    def iter(self):
        return self.storage.iter

    @iter.setter
    def iter(self, value):
        self.storage.iter = int(value)

    @property
    def hooks(self):
        return tuple(self._hooks)

    def register_hooks(self, hooks):
        """Append hooks (None entries are skipped); they run in registration order."""
        for hook in hooks:
            if hook is None:
                continue
            if not isinstance(hook, HookBase):
                raise TypeError("%r is not a HookBase" % (hook,))
            hook.trainer = self
            self._hooks.append(hook)

    def train(self, start_iter, end_iter):
        self.start_iter = self.iter = int(start_iter)
        try:
            for hook in self._hooks:
                hook.before_train()
            for self.iter in range(int(start_iter), int(end_iter)):
                for hook in self._hooks:
                    hook.before_step()
                self.run_step()
                for hook in self._hooks:
                    hook.after_step()
        finally:
            for hook in self._hooks:
                hook.after_train()

    def run_step(self):
        raise NotImplementedError
