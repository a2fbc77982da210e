"""The save of the same state by a framework, with and without fsprobe, in one run.

Goal (issue 20): at most 1.05x, median of paired ratios.

- ``hf``: a Hugging Face `Trainer`'s ``checkpoint-N/`` (GPT-2 from a config, ~50 MB of weights
  plus AdamW's state), `Trainer._save_checkpoint` of a plain trainer against one passed
  through `fsprobe.integrations.transformers.protect` (staged, fsynced, one rename).
- ``returnn``: a RETURNN epoch save (``model.NNN.pt`` and ``model.NNN.opt.pt`` of an LSTM with
  adam, after one trained epoch), RETURNN's own `_save_model` + `save_optimizer` against the
  ones `fsprobe.integrations.returnn.protect` installs.

RETURNN and the Trainer write without fsync; fsprobe fsyncs (that is what makes the save
durable). Each protected method is also timed with ``fsync=False``, to show what durability
costs and what the rest of fsprobe does. The methods run interleaved in a rotating order, with
an untimed `sync` between saves, so all see the same page cache and disk; every save writes a
new step or epoch, as a training does.

    python benchmarks/integration_saves.py [--dir DIR] [--runs 7] [--only hf|returnn] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

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


def timed(save: Callable[[], object]) -> float:
    os.sync()
    start = time.perf_counter()
    save()
    return time.perf_counter() - start


def interleaved(methods: dict[str, Callable[[int], object]], runs: int) -> dict[str, list[float]]:
    """Each method `runs` times (given a new step number each), in a rotating order."""
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    names = list(methods)
    step = itertools.count(100)
    for run in range(runs):
        for name in names[run % len(names) :] + names[: run % len(names)]:
            number = next(step)
            seconds[name].append(timed(lambda m=methods[name], n=number: m(n)))
    return seconds


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

    def saving(made: Trainer) -> Callable[[int], object]:
        def save(step: int) -> None:
            made.state.global_step = step
            made._save_checkpoint(made.model, trial=None)

        return save

    methods = {
        "Trainer": saving(trainer("plain")),
        "protect(Trainer)": saving(protect(trainer("protected"))),
        "protect(Trainer, fsync=False)": saving(protect(trainer("nosync"), fsync=False)),
    }
    return summary(interleaved(methods, runs), "Trainer")


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

    def epoch(save_model: Callable, save_optimizer: Callable) -> Callable[[int], object]:
        def save(number: int) -> None:
            engine.epoch = number
            save_model(engine)
            filename = engine.get_epoch_model_filename() + ".opt.pt"
            save_optimizer(engine._updater, filename)

        return save

    integration.protect()
    fsprobe_model = returnn_engine.Engine._save_model
    fsprobe_optimizer = returnn_updater.Updater.save_optimizer
    nosync = integration._Protection({"fsync": False})
    methods = {
        "RETURNN": epoch(own_model, own_optimizer),
        "protect()": epoch(fsprobe_model, fsprobe_optimizer),
        "protect(fsync=False)": epoch(nosync.save_model, nosync.save_optimizer),
    }
    return summary(interleaved(methods, runs), "RETURNN")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=None, help="where to save (default: a temp dir)")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--only", choices=["hf", "returnn"], default=None)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(dir=options.dir) as directory:
        for name, measure in (("hf", hf), ("returnn", returnn)):
            if options.only in (None, name):
                results[name] = measure(directory, options.runs)
    if options.json:
        print(json.dumps(results, indent=2))
    else:
        for name, rows in results.items():
            for method, row in rows.items():
                ratio = f"  {row['ratio']:.3f}x" if "ratio" in row else ""
                print(f"{name:8} {method:32} {row['median_s'] * 1000:9.1f} ms{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
