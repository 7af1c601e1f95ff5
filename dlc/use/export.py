"""A run's model in the Hugging Face layout of GPT-2, whose blocks dlc's match, and read back.

dlc's blocks are GPT-2's: learned positions, pre-norm LayerNorm, fused query/key/value, a tanh-GELU
MLP, a final LayerNorm and an output layer tied to the embedding or not. So an export is a
`GPT2LMHeadModel` checkpoint that `transformers` loads without custom code:

    dlc                              GPT-2 (transformers)                    how
    embed/embedding  [V, D]          transformer.wte.weight                  as is
    pos_embed/embedding  [C, D]      transformer.wpe.weight                  as is
    blocks/i/norm_attn/scale, bias   transformer.h.i.ln_1.weight, bias       as is
    blocks/i/attn/qkv/kernel [D, 3D] transformer.h.i.attn.c_attn.weight      as is (Conv1D is [in, out]);
                                     transformer.h.i.attn.c_attn.bias        zeros: dlc's has no bias
    blocks/i/attn/out/kernel [D, D]  transformer.h.i.attn.c_proj.weight      as is; its bias zeros
    blocks/i/norm_mlp/scale, bias    transformer.h.i.ln_2.weight, bias       as is
    blocks/i/mlp/up/kernel, bias     transformer.h.i.mlp.c_fc.weight, bias   as is
    blocks/i/mlp/down/kernel, bias   transformer.h.i.mlp.c_proj.weight, bias as is
    norm_out/scale, bias             transformer.ln_f.weight, bias           as is
    head/kernel  [D, V]              lm_head.weight [V, D]                   transposed (untied models only)

Both split the fused projection into query, key and value, each into heads, in that order, and
scale attention by 1/sqrt(head size). config.json says what differs from GPT-2's defaults:
LayerNorm epsilon 1e-6 (Flax's), `gelu_new` (the tanh GELU), no dropout, and the sizes.
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
from dlc.core.model import Params, build_model, flatten_params, unflatten_params
from dlc.core.shapes import mlp_hidden, vocab_size
from dlc.data.tokenizer import TOKENIZER_CONFIG, TOKENIZER_JSON, Tokenizer
from dlc.errors import UserError
from dlc.use.run_model import RunModel

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
DLC_FILE = "dlc.json"  # what dlc reads back: the recipe, the source, the tokenizer
EXPORT_FORMAT = 1
LAYER_NORM_EPS = 1e-6  # flax.nnx.LayerNorm's default


def is_export(path: Path) -> bool:
    return path.is_dir() and (path / DLC_FILE).is_file() and (path / CONFIG_FILE).is_file()


def gpt2_tensors(cfg: ModelConfig, params: Params) -> dict[str, np.ndarray]:
    """dlc's parameters under GPT-2's names and layouts (the table in this module's docstring)."""
    flat = flatten_params(params)
    D = cfg.width
    out = {
        "transformer.wte.weight": flat["embed/embedding"],
        "transformer.wpe.weight": flat["pos_embed/embedding"],
        "transformer.ln_f.weight": flat["norm_out/scale"],
        "transformer.ln_f.bias": flat["norm_out/bias"],
    }
    for i in range(cfg.num_layers):
        b, h = f"blocks/{i}", f"transformer.h.{i}"
        out |= {
            f"{h}.ln_1.weight": flat[f"{b}/norm_attn/scale"],
            f"{h}.ln_1.bias": flat[f"{b}/norm_attn/bias"],
            f"{h}.attn.c_attn.weight": flat[f"{b}/attn/qkv/kernel"],
            f"{h}.attn.c_attn.bias": np.zeros(3 * D, np.float32),
            f"{h}.attn.c_proj.weight": flat[f"{b}/attn/out/kernel"],
            f"{h}.attn.c_proj.bias": np.zeros(D, np.float32),
            f"{h}.ln_2.weight": flat[f"{b}/norm_mlp/scale"],
            f"{h}.ln_2.bias": flat[f"{b}/norm_mlp/bias"],
            f"{h}.mlp.c_fc.weight": flat[f"{b}/mlp/up/kernel"],
            f"{h}.mlp.c_fc.bias": flat[f"{b}/mlp/up/bias"],
            f"{h}.mlp.c_proj.weight": flat[f"{b}/mlp/down/kernel"],
            f"{h}.mlp.c_proj.bias": flat[f"{b}/mlp/down/bias"],
        }
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = flat["head/kernel"].T
    return {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in out.items()}


def dlc_params(cfg: ModelConfig, tensors: dict[str, np.ndarray], like: Params, where: str) -> Params:
    """The inverse of `gpt2_tensors`: GPT-2's tensors back into dlc's parameters, shaped like `like`.

    The biases dlc's attention lacks must be zero: an export edited to hold others is refused.
    """
    for i in range(cfg.num_layers):
        for name in (f"transformer.h.{i}.attn.c_attn.bias", f"transformer.h.{i}.attn.c_proj.bias"):
            if name in tensors and np.any(tensors[name]):
                raise UserError(f"{where}: {name} is not zero, and dlc's attention has no bias: is it a dlc export?")
    names = {v: k for k, v in _dlc_names(cfg).items()}
    expected = flatten_params(like)
    flat = {}
    for path, value in expected.items():
        name = names[path]
        if name not in tensors:
            raise UserError(f"{where} has no tensor {name}: is it a dlc export of this model?")
        tensor = tensors[name].T if path == "head/kernel" else tensors[name]
        if tensor.shape != value.shape:
            raise UserError(f"{where}: {name} has shape {list(tensor.shape)}, the model needs {list(value.shape)}")
        flat[path] = np.asarray(tensor, dtype=np.float32)
    return unflatten_params(flat, like)


def _dlc_names(cfg: ModelConfig) -> dict[str, str]:
    """GPT-2 name -> dlc path, for every tensor dlc has."""
    names = {
        "transformer.wte.weight": "embed/embedding",
        "transformer.wpe.weight": "pos_embed/embedding",
        "transformer.ln_f.weight": "norm_out/scale",
        "transformer.ln_f.bias": "norm_out/bias",
    }
    for i in range(cfg.num_layers):
        b, h = f"blocks/{i}", f"transformer.h.{i}"
        names |= {
            f"{h}.ln_1.weight": f"{b}/norm_attn/scale",
            f"{h}.ln_1.bias": f"{b}/norm_attn/bias",
            f"{h}.attn.c_attn.weight": f"{b}/attn/qkv/kernel",
            f"{h}.attn.c_proj.weight": f"{b}/attn/out/kernel",
            f"{h}.ln_2.weight": f"{b}/norm_mlp/scale",
            f"{h}.ln_2.bias": f"{b}/norm_mlp/bias",
            f"{h}.mlp.c_fc.weight": f"{b}/mlp/up/kernel",
            f"{h}.mlp.c_fc.bias": f"{b}/mlp/up/bias",
            f"{h}.mlp.c_proj.weight": f"{b}/mlp/down/kernel",
            f"{h}.mlp.c_proj.bias": f"{b}/mlp/down/bias",
        }
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = "head/kernel"
    return names


def gpt2_config(cfg: ModelConfig, stop_token: int | None) -> dict[str, Any]:
    """config.json of a `GPT2LMHeadModel` with dlc's sizes and what differs from GPT-2's defaults."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": vocab_size(cfg),
        "n_positions": cfg.context_len,
        "n_embd": cfg.width,
        "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads,
        "n_inner": mlp_hidden(cfg),
        "activation_function": "gelu_new",  # jax.nn.gelu's default, the tanh approximation
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,
        "tie_word_embeddings": cfg.tie_embeddings,
        # The end-of-document token, where the model learned one (a byte corpus has none).
        "bos_token_id": stop_token,
        "eos_token_id": stop_token,
        "torch_dtype": "float32",
    }


@dataclass(frozen=True)
class Exported:
    path: Path
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
    tensors = gpt2_tensors(cfg, model.params)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        mask = os.umask(0)
        os.umask(mask)
        staging.chmod(0o777 & ~mask)  # a directory like any other (mkdtemp makes it private)
        save_file(tensors, str(staging / WEIGHTS_FILE), metadata={"format": "pt", "source": f"dlc {__version__}"})
        (staging / CONFIG_FILE).write_text(json.dumps(gpt2_config(cfg, model.stop_token), indent=2) + "\n")
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
        if out.exists():  # empty, or an earlier export with overwrite: replaced only now
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Exported(out, files, len(tensors), sum(int(v.size) for v in tensors.values()))


def _check_out(out: Path, overwrite: bool) -> None:
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
    graphdef, like = build_model(recipe.model, recipe.run.seed)
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
