"""A run's model in the Hugging Face layout of its block family (GPT-2's or Llama's), and read back.

dlc's two block families (`model.arch`) are those of `GPT2LMHeadModel` and `LlamaForCausalLM`, so an
export is a checkpoint that `transformers` loads without custom code. Each family is one table here
(`_GPT2`, `_LLAMA`): dlc's path -> Hugging Face's name, and whether the tensor is transposed.

GPT-2 (model.arch=gpt): learned positions, pre-norm LayerNorm, fused query/key/value, a tanh-GELU MLP.

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

Llama (model.arch=llama): rotary positions, RMSNorm, separate projections without biases, G = num_kv_heads
key/value heads (grouped-query attention), a SwiGLU MLP of hidden size F. torch's Linear is [out, in].

    dlc                              Llama (transformers)                              how
    embed/embedding  [V, D]          model.embed_tokens.weight                         as is
    blocks/i/norm_attn/scale         model.layers.i.input_layernorm.weight             as is
    blocks/i/attn/q/kernel [D, D]    model.layers.i.self_attn.q_proj.weight            transposed
    blocks/i/attn/k/kernel [D, GK]   model.layers.i.self_attn.k_proj.weight            transposed
    blocks/i/attn/v/kernel [D, GK]   model.layers.i.self_attn.v_proj.weight            transposed
    blocks/i/attn/out/kernel [D, D]  model.layers.i.self_attn.o_proj.weight            transposed
    blocks/i/norm_mlp/scale          model.layers.i.post_attention_layernorm.weight    as is
    blocks/i/mlp/gate/kernel [D, F]  model.layers.i.mlp.gate_proj.weight               transposed
    blocks/i/mlp/up/kernel [D, F]    model.layers.i.mlp.up_proj.weight                 transposed
    blocks/i/mlp/down/kernel [F, D]  model.layers.i.mlp.down_proj.weight               transposed
    norm_out/scale                   model.norm.weight                                 as is
    head/kernel  [D, V]              lm_head.weight [V, D]                             transposed (untied only)

No query or key permutation: dlc's `rotary` is Hugging Face's (each head's dimensions i and i + K/2
rotate together by position x theta^(-2i/K)), and both give query head h key/value head h // (H/G).
config.json gives the sizes, RMSNorm epsilon 1e-6 (Flax's), rope_theta, and no biases.

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
from dlc.core.model import Params, flatten_params, unflatten_params
from dlc.core.shapes import head_dim, kv_heads, mlp_hidden, vocab_size
from dlc.data.tokenizer import TOKENIZER_CONFIG, TOKENIZER_JSON, Tokenizer
from dlc.errors import UserError
from dlc.use.run_model import RunModel

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
DLC_FILE = "dlc.json"  # what dlc reads back: the recipe, the source, the tokenizer
EXPORT_FORMAT = 1
NORM_EPS = 1e-6  # flax.nnx.LayerNorm's and RMSNorm's default


def is_export(path: Path) -> bool:
    return path.is_dir() and (path / DLC_FILE).is_file() and (path / CONFIG_FILE).is_file()


@dataclass(frozen=True)
class _Table:
    """One block family's Hugging Face layout: dlc path -> (Hugging Face name, transposed)."""

    architecture: str
    top: dict[str, tuple[str, bool]]
    block_prefix: str  # of block i's names, with {i}
    block: dict[str, tuple[str, bool]]  # paths under blocks/i
    head: tuple[str, bool]  # head/kernel, in untied models
    # Hugging Face's biases that dlc's blocks lack: written as zeros the size of the named kernel's
    # output, and refused unless zero when read back.
    zero_biases: dict[str, str]


_GPT2 = _Table(
    architecture="GPT2LMHeadModel",
    top={
        "embed/embedding": ("transformer.wte.weight", False),
        "pos_embed/embedding": ("transformer.wpe.weight", False),
        "norm_out/scale": ("transformer.ln_f.weight", False),
        "norm_out/bias": ("transformer.ln_f.bias", False),
    },
    block_prefix="transformer.h.{i}.",
    block={
        "norm_attn/scale": ("ln_1.weight", False),
        "norm_attn/bias": ("ln_1.bias", False),
        "attn/qkv/kernel": ("attn.c_attn.weight", False),  # GPT-2's Conv1D is [in, out], as dlc's kernels
        "attn/out/kernel": ("attn.c_proj.weight", False),
        "norm_mlp/scale": ("ln_2.weight", False),
        "norm_mlp/bias": ("ln_2.bias", False),
        "mlp/up/kernel": ("mlp.c_fc.weight", False),
        "mlp/up/bias": ("mlp.c_fc.bias", False),
        "mlp/down/kernel": ("mlp.c_proj.weight", False),
        "mlp/down/bias": ("mlp.c_proj.bias", False),
    },
    head=("lm_head.weight", True),
    zero_biases={"attn.c_attn.bias": "attn/qkv/kernel", "attn.c_proj.bias": "attn/out/kernel"},
)

_LLAMA = _Table(
    architecture="LlamaForCausalLM",
    top={
        "embed/embedding": ("model.embed_tokens.weight", False),
        "norm_out/scale": ("model.norm.weight", False),
    },
    block_prefix="model.layers.{i}.",
    block={  # torch's Linear is [out, in]: every kernel transposed
        "norm_attn/scale": ("input_layernorm.weight", False),
        "attn/q/kernel": ("self_attn.q_proj.weight", True),
        "attn/k/kernel": ("self_attn.k_proj.weight", True),
        "attn/v/kernel": ("self_attn.v_proj.weight", True),
        "attn/out/kernel": ("self_attn.o_proj.weight", True),
        "norm_mlp/scale": ("post_attention_layernorm.weight", False),
        "mlp/gate/kernel": ("mlp.gate_proj.weight", True),
        "mlp/up/kernel": ("mlp.up_proj.weight", True),
        "mlp/down/kernel": ("mlp.down_proj.weight", True),
    },
    head=("lm_head.weight", True),
    zero_biases={},
)

_TABLES = {"gpt": _GPT2, "llama": _LLAMA}


def architecture(cfg: ModelConfig) -> str:
    """The transformers class an export of this model loads as."""
    return _TABLES[cfg.arch].architecture


def _names(cfg: ModelConfig) -> dict[str, tuple[str, bool]]:
    """dlc path -> (Hugging Face name, transposed), for every tensor dlc has."""
    table = _TABLES[cfg.arch]
    names = dict(table.top)
    for i in range(cfg.num_layers):
        prefix = table.block_prefix.format(i=i)
        names |= {f"blocks/{i}/{path}": (prefix + name, t) for path, (name, t) in table.block.items()}
    if not cfg.tie_embeddings:  # tied: the output layer is the input embedding, transposed
        names["head/kernel"] = table.head
    return names


def _zero_biases(cfg: ModelConfig) -> dict[str, str]:
    """Hugging Face bias name -> the dlc kernel whose output it would be added to."""
    table = _TABLES[cfg.arch]
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
    return llama_config(cfg, stop_token) if cfg.arch == "llama" else gpt2_config(cfg, stop_token)


def gpt2_config(cfg: ModelConfig, stop_token: int | None) -> dict[str, Any]:
    """config.json of a `GPT2LMHeadModel` with dlc's sizes and what differs from GPT-2's defaults."""
    return {
        "architectures": [_GPT2.architecture],
        "model_type": "gpt2",
        "vocab_size": vocab_size(cfg),
        "n_positions": cfg.context_len,
        "n_embd": cfg.width,
        "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads,
        "n_inner": mlp_hidden(cfg),
        "activation_function": "gelu_new",  # jax.nn.gelu's default, the tanh approximation
        "layer_norm_epsilon": NORM_EPS,
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


def llama_config(cfg: ModelConfig, stop_token: int | None) -> dict[str, Any]:
    """config.json of a `LlamaForCausalLM` with dlc's sizes, every field that dlc's blocks fix said."""
    return {
        "architectures": [_LLAMA.architecture],
        "model_type": "llama",
        "vocab_size": vocab_size(cfg),
        "hidden_size": cfg.width,
        "intermediate_size": mlp_hidden(cfg),
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": kv_heads(cfg),
        "head_dim": head_dim(cfg),
        "max_position_embeddings": cfg.context_len,
        "rms_norm_eps": NORM_EPS,
        "rope_theta": cfg.rope_theta,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": stop_token,
        "eos_token_id": stop_token,
        "torch_dtype": "float32",
    }


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
