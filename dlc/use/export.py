"""A run's model in the Hugging Face layout of its block family, and read back.

Each block family (`model.arch`, `dlc.core.arch`) has the layout of a `transformers` class
(`GPT2LMHeadModel`, `LlamaForCausalLM`), so an export is a checkpoint that `transformers` loads
without custom code. The family's module holds its table (dlc's path -> Hugging Face's name, and
whether the tensor is transposed) and its config.json; this module writes and reads by them.

Beside the weights: the run's tokenizer (tokenizer.json and tokenizer_config.json) and dlc.json,
what dlc needs to read the export again (the recipe, the model's source, the tokenizer's spec).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dlc import __version__
from dlc.config.load import dump_recipe, recipe_from_dict
from dlc.config.workload import ModelConfig
from dlc.core.abstract import abstract_params
from dlc.core.arch import family
from dlc.core.model import Params, flatten_params, unflatten_params
from dlc.data.tokenizer import TOKENIZER_CONFIG, TOKENIZER_JSON, Tokenizer
from dlc.errors import UserError
from dlc.use.run_model import RunModel

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
DLC_FILE = "dlc.json"  # what dlc reads back: the recipe, the source, the tokenizer
EXPORT_FORMAT = 1


def is_export(path: Path) -> bool:
    return path.is_dir() and (path / DLC_FILE).is_file() and (path / CONFIG_FILE).is_file()


def architecture(cfg: ModelConfig) -> str:
    """The transformers class an export of this model loads as."""
    return family(cfg.arch).hf.architecture


def _names(cfg: ModelConfig) -> dict[str, tuple[str, bool]]:
    """dlc path -> (Hugging Face name, transposed), for every tensor dlc has."""
    table = family(cfg.arch).hf
    names = dict(table.top)
    for i in range(cfg.num_layers):
        prefix = table.block_prefix.format(i=i)
        names |= {f"blocks/{i}/{path}": (prefix + name, t) for path, (name, t) in table.block.items()}
    if not cfg.tie_embeddings:  # tied: the output layer is the input embedding, transposed
        names["head/kernel"] = table.head
    return names


def _zero_biases(cfg: ModelConfig) -> dict[str, str]:
    """Hugging Face bias name -> the dlc kernel whose output it would be added to."""
    table = family(cfg.arch).hf
    return {
        table.block_prefix.format(i=i) + bias: f"blocks/{i}/{kernel}"
        for i in range(cfg.num_layers)
        for bias, kernel in table.zero_biases.items()
    }


def hf_tensors(cfg: ModelConfig, params: Params) -> dict[str, np.ndarray]:
    """dlc's parameters under Hugging Face's names and layouts (the tables in this module's docstring)."""
    flat = flatten_params(params)
    out = {name: flat[path].T if transposed else flat[path] for path, (name, transposed) in _names(cfg).items()}
    out |= {bias: np.zeros(flat[kernel].shape[-1], np.float32) for bias, kernel in _zero_biases(cfg).items()}
    return {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in out.items()}


def dlc_params(cfg: ModelConfig, tensors: dict[str, np.ndarray], like: Params, where: str) -> Params:
    """The inverse of `hf_tensors`: Hugging Face's tensors back into dlc's parameters, shaped like `like`.

    The biases dlc's blocks lack must be zero: an export edited to hold others is refused.
    """
    for name in _zero_biases(cfg):
        if name in tensors and np.any(tensors[name]):
            raise UserError(f"{where}: {name} is not zero, and dlc's attention has no bias: is it a dlc export?")
    names = _names(cfg)
    flat = {}
    for path, value in flatten_params(like).items():
        name, transposed = names[path]
        if name not in tensors:
            raise UserError(f"{where} has no tensor {name}: is it a dlc export of this model?")
        tensor = tensors[name].T if transposed else tensors[name]
        if tensor.shape != value.shape:
            raise UserError(f"{where}: {name} has shape {list(tensor.shape)}, the model needs {list(value.shape)}")
        flat[path] = np.asarray(tensor, dtype=np.float32)
    return unflatten_params(flat, like)


def hf_config(cfg: ModelConfig, stop_token: int | None) -> dict[str, Any]:
    """config.json for the model's block family."""
    layout = family(cfg.arch).hf
    return {"architectures": [layout.architecture], **layout.config(cfg, stop_token)}


@dataclass(frozen=True)
class Exported:
    path: Path
    architecture: str  # the transformers class it loads as: GPT2LMHeadModel or LlamaForCausalLM
    files: dict[str, int]  # name -> bytes
    tensors: int
    params: int


def export_model(model: RunModel, out: Path, overwrite: bool = False) -> Exported:
    """Write `model` to directory `out`, whole or not at all: it is written beside `out` and renamed into place.

    `out` must not exist, be an empty directory, or (with `overwrite`) hold an earlier export.
    """
    out = out.expanduser()
    _check_out(out, overwrite)
    from safetensors.numpy import save_file

    cfg = model.recipe.model
    tensors = hf_tensors(cfg, model.params)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    except OSError as exc:
        raise _unwritable(out, exc) from None
    try:
        mask = os.umask(0)
        os.umask(mask)
        staging.chmod(0o777 & ~mask)  # a directory like any other (mkdtemp makes it private)
        save_file(tensors, str(staging / WEIGHTS_FILE), metadata={"format": "pt", "source": f"dlc {__version__}"})
        (staging / CONFIG_FILE).write_text(json.dumps(hf_config(cfg, model.stop_token), indent=2) + "\n")
        (staging / TOKENIZER_JSON).write_text(model.tokenizer.to_json())
        tokenizer_config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": cfg.context_len,
            "clean_up_tokenization_spaces": False,
        }
        if model.stop_token is not None:  # the model learned to end documents with it
            tokenizer_config |= {"eos_token": model.tokenizer.eos_token, "bos_token": model.tokenizer.eos_token}
        (staging / TOKENIZER_CONFIG).write_text(json.dumps(tokenizer_config, indent=2) + "\n")
        record = {
            "format": EXPORT_FORMAT,
            "dlc_version": __version__,
            "source": model.source,
            "tokenizer": {
                "spec": model.tokenizer.spec,
                "eos_token": model.tokenizer.eos_token,
                "stop_token": model.stop_token,
            },
            "recipe": yaml.safe_load(dump_recipe(model.recipe)),
        }
        (staging / DLC_FILE).write_text(json.dumps(record, indent=2) + "\n")
        for file in staging.iterdir():
            file.chmod(0o666 & ~mask)  # safetensors writes its file private
        files = {p.name: p.stat().st_size for p in sorted(staging.iterdir())}
        # Empty, or an earlier export with overwrite: moved aside, and removed once the new one is in place.
        old = out.parent / f".{out.name}.replaced-{os.getpid()}" if out.exists() else None
        if old is not None:
            out.rename(old)
        staging.rename(out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise _unwritable(out, exc) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Exported(out, architecture(cfg), files, len(tensors), sum(int(v.size) for v in tensors.values()))


def _unwritable(out: Path, exc: OSError) -> UserError:
    return UserError(f"cannot write --out {str(out)!r} ({exc.strerror or exc}): choose a writable directory")


def _check_out(out: Path, overwrite: bool) -> None:
    if out.is_symlink():
        raise UserError(f"--out {str(out)!r} is a symbolic link: pass the directory itself, or a new one")
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file: pass a directory to create")
    if not any(out.iterdir()):
        return
    if not is_export(out):
        raise UserError(f"--out {str(out)!r} exists and holds files that are not a dlc export: pass a new directory")
    if not overwrite:
        raise UserError(
            f"--out {str(out)!r} holds an export already: pass --overwrite to replace it, or a new directory"
        )


def load_export(path: Path) -> RunModel:
    """A model that `export_model` wrote, read back as dlc's own."""
    try:
        record = json.loads((path / DLC_FILE).read_text())
        recipe_data, tok = record["recipe"], record["tokenizer"]
        spec, eos, stop = str(tok["spec"]), str(tok["eos_token"]), tok["stop_token"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{str(path / DLC_FILE)!r} is damaged ({exc}): export the run again") from None
    if record.get("format") != EXPORT_FORMAT:
        raise UserError(
            f"{str(path)!r} is an export of format {record.get('format')!r}; this dlc reads format {EXPORT_FORMAT}"
        )
    recipe = recipe_from_dict(recipe_data, origin=str(path / DLC_FILE))
    graphdef, like = abstract_params(recipe.model)  # the structure alone: every value is read
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(path / WEIGHTS_FILE))
    except (OSError, SafetensorError) as exc:
        raise UserError(f"{str(path / WEIGHTS_FILE)!r} cannot be read ({exc}): export the run again") from None
    params = dlc_params(recipe.model, tensors, like, str(path / WEIGHTS_FILE))
    tokenizer = Tokenizer.from_file(path / TOKENIZER_JSON, spec=spec, eos=eos)
    source = f"the export in {path} ({record.get('source', 'a dlc model')})"
    return RunModel(recipe, graphdef, params, source, tokenizer, stop)


def load_model(path: Path | None, checkpoint: int | None = None, learner: int | None = None) -> tuple[Path, RunModel]:
    """The model a command reads: an export, or a run directory's (default: the latest run's) model."""
    from dlc.run.files import resolve_run
    from dlc.use.run_model import load_run_model

    if path is not None and is_export(path.expanduser()):
        if checkpoint is not None or learner is not None:
            raise UserError(
                f"{str(path)!r} is an export, one model: --checkpoint and --learner apply to run directories"
            )
        return path, load_export(path.expanduser())
    run = resolve_run(path)
    return run, load_run_model(run, checkpoint, learner)
