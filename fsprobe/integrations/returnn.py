"""RETURNN (PyTorch backend): an epoch's model, optimizer state and learning-rate file saved
through fsprobe, and a resume that finds them wherever they landed.

What is patched and why it is pinned to `RETURNN_VERSIONS`: docs/integrations.md, "RETURNN".
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
from collections.abc import Callable, Iterable
from typing import Any

from fsprobe.extras import extra_imports, install_hint

with extra_imports("returnn", __name__, "returnn", "torch"):
    import returnn
    import returnn.torch.engine as returnn_engine
    import returnn.torch.updater as returnn_updater
    from returnn.learning_rate_control import LearningRateControl
    from returnn.log import log as returnn_log
    from returnn.util import basic as returnn_util

from fsprobe import SaveOptions, atomic_write, locate, save
from fsprobe.redirect.fallback import all_fallback_dirs
from fsprobe.redirect.manifest import forget

#: The RETURNN releases whose save and load code these patches were written against, with the
#: sha256 of the source of each method replaced or relied on (a modified install is refused).
RETURNN_VERSIONS = {
    "1.20261022.211313": {
        "Engine._save_model": "1b92b93dfcd6597393428b844fc157700a5978c058a7dfa14e79f0f5077b2400",
        "Updater.save_optimizer": (
            "489d3b2e96704bdef720c9d1a603264bafe8c18b801e9e9322e4a519cdab53c5"
        ),
        "EngineBase.get_existing_models": (
            "974f5322b60d13ac570e23b652fab8bd5ce790ad2a5fb302e5fe17d2315bb37b"
        ),
        "EngineBase.cleanup_old_models": (
            "66d94d438d0db07b6d7c91f14b0075e6008a18a777b709af3bd53e532ee77d71"
        ),
        "Engine.delete_model": "676c6ba66904e63dab2ef415895f65eab4c8d2dc7adf251aae8a3f7d0a2be487",
        "Engine._save_optimizer": (
            "6b0837b7c02849c4c6723635293766ad91e44e4f54f0a2da4798e27405bf1a6e"
        ),
        "LearningRateControl.__init__": (
            "0b1edc9c7b7bf98934db40177b3f36bc4691d6682f3e519c5932b5a8bff7699f"
        ),
        "LearningRateControl.save": (
            "2657c7c440656640e0172301689a6b111b9be80c23081b8751b1bf001f74299c"
        ),
        "LearningRateControl.load": (
            "22ce164c6705b164528d5b5574c379483813d3a8b478564b8548df6f93ffdc82"
        ),
    },
}
_MODEL_SUFFIX = ".pt"
_OPTIMIZER_SUFFIX = ".opt.pt"


class UnknownReturnn(RuntimeError):
    """The installed RETURNN is not one whose save code fsprobe knows."""


class _Protection:
    """The save options of `protect`, and the patched methods that use them."""

    def __init__(self, options: SaveOptions) -> None:
        self.options = options
        self.fallback_dirs = options.fallback_dirs
        #: The epochs `existing_models` found redirected: their copy's name -> RETURNN's.
        self.requested: dict[str, str] = {}

    def save(self, obj: dict[str, Any], filename: str) -> None:
        _make_parent(filename)
        save(obj, filename, options=self.options)

    def located(self, filename: str) -> str:
        return locate(filename, fallback_dirs=self.fallback_dirs)

    def forget(self, filename: str) -> int:
        """Remove the redirected copies of `filename` (RETURNN deleted it) and their manifest
        entries; the bytes of the newest one, the one RETURNN would have loaded."""
        where, nbytes = self.located(filename), 0
        if where != os.path.abspath(filename):
            with contextlib.suppress(FileNotFoundError):
                nbytes = os.stat(where).st_size
        forget(filename, all_fallback_dirs(self.fallback_dirs))
        return nbytes

    # -- the patched methods (self is the protection; the engine or updater comes first) -------

    def save_model(self, engine: Any) -> None:
        """`Engine._save_model`: the same dictionary, saved by `fsprobe.save`."""
        if not engine._do_save():
            return
        filename = engine.get_epoch_model_filename() + returnn_util.get_model_filename_postfix()
        print(f"Save model under {filename}", file=returnn_log.v4)
        state_dict = engine._pt_model.state_dict()
        if engine._ignore_param_set:
            remaining = set(state_dict).intersection(engine._ignore_param_set)
            assert not remaining, f"_save_model: found remaining params to ignore: {remaining}"
        updater = engine._updater
        self.save(
            {
                "model": state_dict,
                "epoch": engine.epoch,
                "step": engine.global_train_step,
                "effective_learning_rate": updater.get_effective_learning_rate()
                if updater
                else None,
                "returnn_version": returnn.__long_version__,
            },
            filename,
        )

    def save_optimizer(self, updater: Any, filename: str) -> None:
        """`Updater.save_optimizer`: the same dictionary, saved by `fsprobe.save`."""
        param_names, _ = updater._get_opt_param_names()
        print(f"Save optimizer under {filename}", file=returnn_log.v4)
        state = updater.optimizer.state_dict()
        if updater._optimizer_step is not None:
            state = updater._optimizer_step.state_dict_to_host_scalars(state)
        self.save(
            {
                "optimizer": state,
                "optimizer_class_name": updater.optimizer.__class__.__name__,
                "optimizer_opts": returnn_updater._optimizer_opts_for_checkpoint(
                    updater._optimizer_opts
                ),
                "param_names": param_names,
                "epoch": updater._current_epoch,
                "step": updater._current_train_step,
                "effective_learning_rate": updater.get_effective_learning_rate(),
                "returnn_version": returnn.__long_version__,
            },
            filename,
        )

    def existing_models(
        self,
        original: Callable[[Any, bool | None], dict[int, str]],
        config: Any,
        for_training: bool | None,
    ) -> dict[int, str]:
        """RETURNN's epochs on disk, each at its newest copy: the target or a fallback."""
        found = original(config, for_training)
        model = config.value("model", "")
        if not model:
            return found
        if for_training is None:
            for_training = config.value("task", "train") == "train"
        final = returnn_engine.Engine.config_get_final_epoch(config)
        for epoch in range(1, final + 1):
            base = returnn_engine.Engine.epoch_model_filename(model, epoch)
            where = self.located(base + _MODEL_SUFFIX)
            if not os.path.exists(where):
                continue
            if for_training and not os.path.exists(self.located(base + _OPTIMIZER_SUFFIX)):
                continue  # as RETURNN: no optimizer state (anywhere), no resume from it
            if where == os.path.abspath(base + _MODEL_SUFFIX):
                found[epoch] = base  # the model at RETURNN's path (its optimizer state anywhere)
            else:
                found[epoch] = where[: -len(_MODEL_SUFFIX)]
                self.requested[found[epoch]] = base
        return found

    def delete_model(self, filename: str) -> int:
        """`Engine.delete_model` (of an epoch `existing_models` found): the model and its
        optimizer state at RETURNN's path, and fsprobe's redirected copies of them."""
        requested = self.requested.pop(filename, filename)
        deleted = 0
        for suffix in (_MODEL_SUFFIX, _OPTIMIZER_SUFFIX):
            path = requested + suffix
            deleted += self.forget(path)
            if os.path.exists(path):  # RETURNN's own file, deleted as RETURNN does
                deleted += os.stat(path).st_size
                os.remove(path)
        return deleted

    def save_optimizer_of(self, original: Callable[[Any], None], engine: Any) -> None:
        """`Engine._save_optimizer`, which also deletes the optimizer state of two epochs ago
        at RETURNN's path: its redirected copies go too."""
        original(engine)
        clean_epoch = engine.epoch - 2
        if (
            engine._do_save()
            and clean_epoch > 0
            and not engine.config.bool("apply_cleanup_old_models_to_optim_states", False)
        ):
            self.forget(engine.get_epoch_model_filename(epoch=clean_epoch) + _OPTIMIZER_SUFFIX)

    def load_optimizer(self, original: Any, updater: Any, filename: str) -> None:
        """`Updater.load_optimizer` of the newest copy of `filename`."""
        original(updater, self.located(filename))

    def save_learning_rates(self, control: Any) -> None:
        """`LearningRateControl.save`: the same text, written by `fsprobe.atomic_write`; once
        it is back at RETURNN's path, its redirected copies of earlier epochs go."""
        if not control.filename:
            return
        text = (returnn_util.better_repr(control.epoch_data) + "\n").encode()
        _make_parent(control.filename)
        written = atomic_write(
            control.filename, lambda stream: stream.write(text), options=self.options
        )
        if not written.redirected:  # it holds every epoch's scores: older copies are void
            forget(control.filename, all_fallback_dirs(self.fallback_dirs))

    def init_learning_rates(
        self, original: Callable[..., None], control: Any, *args: Any, **kwargs: Any
    ) -> None:
        """`LearningRateControl.__init__`, loading the newest copy of its file; it saves to
        RETURNN's path all the same."""
        bound = inspect.signature(original).bind(control, *args, **kwargs)
        filename = bound.arguments.get("filename")
        if filename and self.located(filename) != os.path.abspath(filename):
            bound.arguments["filename"] = self.located(filename)
        original(*bound.args, **bound.kwargs)
        control.filename = filename


def protect(
    *,
    fallback_dirs: Iterable[str | os.PathLike[str]] = (),
    max_wait: float = 0.0,
    save_timeout: float | None = None,
    **save_kwargs: Any,
) -> None:
    """Send RETURNN's model, optimizer and learning-rate saves through fsprobe, and let its
    resume find redirected epochs. Call it once, from the config; `fallback_dirs`, `max_wait`,
    `save_timeout` and `save_kwargs` (``attempts``, ``backoff``, ``state_dir``...) are the
    `fsprobe.SaveOptions`, checked here: a wrong one is a TypeError or ValueError in the config,
    not at the end of the first epoch. Raises `UnknownReturnn` on a RETURNN version it does not
    know.
    """
    engine, updater = returnn_engine.Engine, returnn_updater.Updater
    if getattr(engine, "_fsprobe_protection", None) is not None:
        raise RuntimeError("fsprobe.integrations.returnn.protect() was called already")
    _check_version()
    protection = _Protection(
        SaveOptions(
            **save_kwargs,
            fallback_dirs=tuple(os.fspath(d) for d in fallback_dirs),
            max_wait=max_wait,
            save_timeout=save_timeout,
        )
    )
    existing, loading = engine.get_existing_models.__func__, updater.load_optimizer
    saving_optimizer = engine._save_optimizer
    initializing = LearningRateControl.__init__
    engine._save_model = lambda self: protection.save_model(self)
    engine._save_optimizer = lambda self: protection.save_optimizer_of(saving_optimizer, self)
    engine.delete_model = staticmethod(protection.delete_model)
    updater.save_optimizer = lambda self, filename: protection.save_optimizer(self, filename)
    engine.get_existing_models = classmethod(
        lambda cls, config, *, for_training=None: protection.existing_models(
            lambda c, for_training: existing(cls, c, for_training=for_training),
            config,
            for_training,
        )
    )
    updater.load_optimizer = lambda self, filename: protection.load_optimizer(
        loading, self, filename
    )
    LearningRateControl.save = lambda self: protection.save_learning_rates(self)
    LearningRateControl.__init__ = lambda self, *args, **kwargs: protection.init_learning_rates(
        initializing, self, *args, **kwargs
    )
    engine._fsprobe_protection = protection  # the patches' owner; also: protected already


def _check_version() -> None:
    """Refuse a RETURNN whose save code is not the one the patches copy."""
    known = RETURNN_VERSIONS.get(returnn.__version__)
    if known is None:
        raise UnknownReturnn(
            f"fsprobe.integrations.returnn knows RETURNN {', '.join(sorted(RETURNN_VERSIONS))}, "
            f"not {returnn.__version__} ({returnn.__long_version__}): its save code may differ, "
            "and a patch that wrote other files than RETURNN's would break resuming. Install a "
            f"known version ({install_hint('returnn')}) or ask fsprobe to support this one"
        )
    methods = {
        "Engine._save_model": returnn_engine.Engine._save_model,
        "Updater.save_optimizer": returnn_updater.Updater.save_optimizer,
        "EngineBase.get_existing_models": returnn_engine.EngineBase.get_existing_models,
        "EngineBase.cleanup_old_models": returnn_engine.EngineBase.cleanup_old_models,
        "Engine.delete_model": returnn_engine.Engine.delete_model,
        "Engine._save_optimizer": returnn_engine.Engine._save_optimizer,
        "LearningRateControl.__init__": LearningRateControl.__init__,
        "LearningRateControl.save": LearningRateControl.save,
        "LearningRateControl.load": LearningRateControl.load,
    }
    changed = [
        name
        for name, method in methods.items()
        if hashlib.sha256(inspect.getsource(method).encode()).hexdigest() != known[name]
    ]
    if changed:
        raise UnknownReturnn(
            f"RETURNN {returnn.__version__} here is not as released: {', '.join(changed)} "
            "changed (a patched or newer install under an old version number); fsprobe's "
            "copies of them would not write what it writes"
        )


def _make_parent(filename: str) -> None:
    """RETURNN makes the directory of the file it saves; so do its replacements."""
    directory = os.path.dirname(filename)
    if directory:
        os.makedirs(directory, exist_ok=True)
