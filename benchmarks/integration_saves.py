"""The save of the same state by a framework, with and without fsprobe, in one run.

Goal (issue 20): at most 1.05x, median of paired ratios.

- ``lightning``: `Trainer.save_checkpoint`'s write of one checkpoint dict (a 4096x4096 linear
  layer and SGD's momentum, ~130 MB), Lightning's `TorchCheckpointIO` against
  `FsprobeCheckpointIO`.

- ``hf``: a Hugging Face `Trainer`'s ``checkpoint-N/`` (GPT-2 from a config, ~50 MB of weights
  plus AdamW's state), `Trainer._save_checkpoint` of a plain trainer against one passed
  through `fsprobe.integrations.transformers.protect` (staged, fsynced, one rename).
- ``returnn``: a RETURNN epoch save (``model.NNN.pt`` and ``model.NNN.opt.pt`` of an LSTM with
  adam, after one trained epoch), RETURNN's own `_save_model` + `save_optimizer` against the
  ones `fsprobe.integrations.returnn.protect` installs.

The frameworks write without fsync; fsprobe fsyncs (that is what makes the save durable).
Each protected method is also timed with ``fsync=False``, to show what durability costs and
what the rest of fsprobe does, and against the floor: the bytes of the framework's own save
written to new files and fsynced by hand (every file, then its directory), which no durable
save can beat. The methods run interleaved in a rotating order, with an untimed `sync` between
saves, so all see the same page cache and disk; every save writes a new step or epoch, as a
training does, removed (untimed) once timed. Run it with ``--dir`` on a tmpfs and on a disk.

    python benchmarks/integration_saves.py [--dir DIR] [--runs 15] [--only hf|returnn|lightning]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from fsprobe import SaveOptions

RETURNN_CONFIG = """\
#!rnn.py
import torch

backend = "torch"
task = "train"
device = "cpu"
train = {{"class": "Task12AXDataset", "num_seqs": 8}}
extern_data = {{"data": {{"dim": 9}}, "classes": {{"dim": 2, "sparse": True}}}}
batch_size = 2000
max_seqs = 8
num_epochs = 1
model = {model!r}
optimizer = {{"class": "adam"}}
learning_rate = 0.001
log_verbosity = 2
torch_dataloader_opts = {{"num_workers": 0}}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(9, 1024, num_layers=2, batch_first=True)
        self.out = torch.nn.Linear(1024, 2)

    def forward(self, x):
        return self.out(self.lstm(x)[0])


def get_model(**_kwargs):
    return Model()


def train_step(*, model, extern_data, **_kwargs):
    import returnn.frontend as rf

    data, classes = extern_data["data"], extern_data["classes"]
    logits = model(data.raw_tensor.float())
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), classes.raw_tensor.long())
    rf.get_run_ctx().mark_as_loss(name="ce", loss=loss)
"""


#: A save: given a new step number, writes it and returns the paths it wrote.
Save = Callable[[int], list[str]]


def timed(save: Save, number: int) -> float:
    os.sync()
    start = time.perf_counter()
    written = save(number)
    seconds = time.perf_counter() - start
    for path in written:  # untimed: a tmpfs holds every save in memory
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    return seconds


def interleaved(methods: dict[str, Save], runs: int) -> dict[str, list[float]]:
    """Each method `runs` times (given a new step number each), in a rotating order."""
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    names = list(methods)
    step = itertools.count(100)
    for run in range(runs):
        for name in names[run % len(names) :] + names[: run % len(names)]:
            seconds[name].append(timed(methods[name], next(step)))
    return seconds


def contents(paths: list[str]) -> dict[str, bytes]:
    """The bytes of the files `paths` are (or hold), by their path relative to the parent."""
    found = {}
    for path in paths:
        parent = os.path.dirname(path)
        files = (
            [path]
            if os.path.isfile(path)
            else [os.path.join(d, n) for d, _, names in os.walk(path) for n in names]
        )
        for name in files:
            with open(name, "rb") as stream:
                found[os.path.relpath(name, parent)] = stream.read()
    return found


def floor(directory: str, files: dict[str, bytes]) -> Save:
    """The same bytes written to new files and fsynced by hand: each file, then each directory."""

    def save(step: int) -> list[str]:
        root = os.path.join(directory, f"floor-{step}")
        directories = {root}
        for name, data in files.items():
            path = os.path.join(root, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            directories.add(os.path.dirname(path))
            with open(path, "wb") as stream:
                stream.write(data)
                stream.flush()
                os.fsync(stream.fileno())
        for made in [*sorted(directories, key=len, reverse=True), directory]:
            descriptor = os.open(made, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        return [root]

    return save


def summary(seconds: dict[str, list[float]], baseline: str) -> dict[str, object]:
    result: dict[str, object] = {
        name: {"median_s": round(statistics.median(values), 4)} for name, values in seconds.items()
    }
    for name, values in seconds.items():
        if name != baseline:
            ratios = [ours / theirs for ours, theirs in zip(values, seconds[baseline])]
            result[name]["ratio"] = round(statistics.median(ratios), 3)  # type: ignore[index]
    return result


def hf(directory: str, runs: int) -> dict[str, object]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from fsprobe.integrations.transformers import protect

    def trainer(name: str) -> Trainer:
        torch.manual_seed(0)
        config = GPT2Config(vocab_size=8000, n_positions=64, n_embd=512, n_layer=4, n_head=8)
        ids = torch.randint(0, 8000, (4, 64))
        args = TrainingArguments(
            os.path.join(directory, name),
            max_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        )
        made = Trainer(
            model=GPT2LMHeadModel(config),
            args=args,
            train_dataset=[{"input_ids": i, "labels": i} for i in ids],
        )
        made.train()  # an optimizer with state, as at any save step
        return made

    def saving(made: Trainer) -> Save:
        def save(step: int) -> list[str]:
            made.state.global_step = step
            made._save_checkpoint(made.model, trial=None)
            return [os.path.join(made.args.output_dir, f"checkpoint-{step}")]

        return save

    plain = saving(trainer("plain"))
    methods = {
        "Trainer": plain,
        "protect(Trainer)": saving(protect(trainer("protected"))),
        "protect(Trainer, fsync=False)": saving(protect(trainer("nosync"), fsync=False)),
        "floor": floor(os.path.join(directory, "floor"), contents(plain(1))),
    }
    return summary(interleaved(methods, runs), "Trainer")


def lightning(directory: str, runs: int) -> dict[str, object]:
    import torch
    from lightning.fabric.plugins import TorchCheckpointIO

    from fsprobe.integrations.lightning import FsprobeCheckpointIO

    torch.manual_seed(0)
    model = torch.nn.Linear(4096, 4096)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, 4096)).sum().backward()
    optimizer.step()  # momentum buffers: an optimizer with state
    checkpoint = {
        "epoch": 0,
        "global_step": 1,
        "state_dict": model.state_dict(),
        "optimizer_states": [optimizer.state_dict()],
    }
    os.makedirs(os.path.join(directory, "lightning"))

    def saving(io: TorchCheckpointIO) -> Save:
        def save(step: int) -> list[str]:
            path = os.path.join(directory, "lightning", f"step={step}.ckpt")
            io.save_checkpoint(checkpoint, path)
            return [path]

        return save

    plain = saving(TorchCheckpointIO())
    methods = {
        "TorchCheckpointIO": plain,
        "FsprobeCheckpointIO": saving(FsprobeCheckpointIO()),
        "FsprobeCheckpointIO(fsync=False)": saving(FsprobeCheckpointIO(fsync=False)),
        "floor": floor(os.path.join(directory, "lightning-floor"), contents(plain(1))),
    }
    return summary(interleaved(methods, runs), "TorchCheckpointIO")


def returnn(directory: str, runs: int) -> dict[str, object]:
    import returnn.__main__ as rnn
    import returnn.torch.engine as returnn_engine
    import returnn.torch.updater as returnn_updater

    from fsprobe.integrations import returnn as integration

    config = os.path.join(directory, "returnn.config")
    with open(config, "w") as stream:
        stream.write(RETURNN_CONFIG.format(model=os.path.join(directory, "returnn", "model")))
    own_model = returnn_engine.Engine._save_model
    own_optimizer = returnn_updater.Updater.save_optimizer
    rnn.init(command_line_options=[config])
    rnn.engine.init_train_from_config(rnn.config, rnn.train_data, rnn.dev_data, rnn.eval_data)
    rnn.engine.train()  # one epoch: a model and an optimizer state to save
    engine = rnn.engine

    def epoch(save_model: Callable, save_optimizer: Callable) -> Save:
        def save(number: int) -> list[str]:
            engine.epoch = number
            save_model(engine)
            filename = engine.get_epoch_model_filename() + ".opt.pt"
            save_optimizer(engine._updater, filename)
            return [engine.get_epoch_model_filename() + ".pt", filename]

        return save

    integration.protect()
    fsprobe_model = returnn_engine.Engine._save_model
    fsprobe_optimizer = returnn_updater.Updater.save_optimizer
    nosync = integration._Protection(SaveOptions(fsync=False))
    plain = epoch(own_model, own_optimizer)
    methods = {
        "RETURNN": plain,
        "protect()": epoch(fsprobe_model, fsprobe_optimizer),
        "protect(fsync=False)": epoch(nosync.save_model, nosync.save_optimizer),
        "floor": floor(os.path.join(directory, "returnn-floor"), contents(plain(1))),
    }
    return summary(interleaved(methods, runs), "RETURNN")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=None, help="where to save (default: a temp dir)")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--only", choices=["hf", "returnn", "lightning"], default=None)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(dir=options.dir) as directory:
        for name, measure in (("lightning", lightning), ("hf", hf), ("returnn", returnn)):
            if options.only in (None, name):
                results[name] = measure(directory, options.runs)
    if options.json:
        print(json.dumps(results, indent=2))
    else:
        for name, rows in results.items():
            for method, row in rows.items():
                ratio = f"  {row['ratio']:.3f}x" if "ratio" in row else ""
                print(f"{name:9} {method:34} {row['median_s'] * 1000:9.1f} ms{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
