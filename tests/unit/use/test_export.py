"""`dlc export`: a run's model in GPT-2's or Llama's Hugging Face layout, read back by dlc and by transformers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dlc.core.model import apply_model
from dlc.use.export import CONFIG_FILE, DLC_FILE, WEIGHTS_FILE, load_export
from dlc.use.run_model import load_run_model
from tests.helpers import assert_user_error, invoke, run_cli
from tests.unit.use.test_run_model import write_run

# Llama's blocks with grouped-query attention: two key/value heads, each serving two query heads.
LLAMA = ["model.arch=llama", "model.num_heads=4", "model.num_kv_heads=2"]
MODELS = {
    "gpt-tied": [],
    "gpt-untied": ["model.tie_embeddings=false"],
    "llama-tied": LLAMA,
    "llama-untied": [*LLAMA, "model.tie_embeddings=false"],
}
TRANSFORMERS = ["gpt-untied", "llama-tied", "llama-untied"]  # the models compared with transformers' own


def tokens(vocab: int, context: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, vocab, size=(2, context), dtype=np.int32)


def export(run, out, *args: str) -> None:
    result = invoke("export", str(run), "--out", str(out), *args)
    assert result.exit_code == 0, result.stderr
    assert f"to {out}" in result.stdout and WEIGHTS_FILE in result.stdout


@pytest.mark.parametrize("overrides", MODELS.values(), ids=MODELS.keys())
def test_an_export_read_back_is_the_same_model(overrides, tmp_path):
    write_run(tmp_path / "run", *overrides)
    export(tmp_path / "run", tmp_path / "export")
    original, again = load_run_model(tmp_path / "run"), load_export(tmp_path / "export")
    assert again.recipe == original.recipe and again.stop_token == original.stop_token
    assert again.tokenizer.spec == "bytes" and "syncer checkpoint 20" in again.source
    x = tokens(256, again.recipe.model.context_len)
    np.testing.assert_allclose(
        np.asarray(apply_model(again.graphdef, again.params, x)),
        np.asarray(apply_model(original.graphdef, original.params, x)),
        atol=1e-5,
    )
    # Samples and scores as the run's own model does.
    args = ["-p", "def ", "-n", "10", "-t", "0"]
    assert (
        invoke("sample", str(tmp_path / "export"), *args).stdout
        == invoke("sample", str(tmp_path / "run"), *args).stdout
    )
    own = json.loads(invoke("eval", str(tmp_path / "run")).stdout.splitlines()[-1])
    theirs = json.loads(
        invoke("eval", str(tmp_path / "export"), "--data", str(tmp_path / "run")).stdout.splitlines()[-1]
    )
    assert theirs["loss"] == pytest.approx(own["loss"], abs=1e-6) and theirs["tokens"] == own["tokens"]


def test_the_export_is_gpt2s_layout(tmp_path):
    from safetensors.numpy import load_file

    write_run(tmp_path / "run", "model.tie_embeddings=false")
    export(tmp_path / "run", tmp_path / "export")
    config = json.loads((tmp_path / "export" / CONFIG_FILE).read_text())
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["activation_function"] == "gelu_new"
    assert (config["n_embd"], config["n_layer"], config["n_head"], config["n_inner"]) == (32, 2, 2, 128)
    assert config["layer_norm_epsilon"] == 1e-6 and config["tie_word_embeddings"] is False
    tensors = load_file(str(tmp_path / "export" / WEIGHTS_FILE))
    block = {"ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}
    expected = {"transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight"} | {
        f"transformer.{layer}.{part}" for layer in ("ln_f",) for part in ("weight", "bias")
    }
    expected |= {f"transformer.h.{i}.{m}.{part}" for i in range(2) for m in block for part in ("weight", "bias")}
    assert set(tensors) == expected
    assert tensors["transformer.h.0.attn.c_attn.weight"].shape == (32, 96)  # Conv1D: [in, out]
    assert not tensors["transformer.h.1.attn.c_attn.bias"].any()
    assert tensors["lm_head.weight"].shape == (256, 32)
    record = json.loads((tmp_path / "export" / DLC_FILE).read_text())
    assert record["tokenizer"]["spec"] == "bytes" and record["recipe"]["model"]["width"] == 32
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(tmp_path / "export" / "tokenizer.json"))
    assert hf.encode("héllo", add_special_tokens=False).ids == list("héllo".encode())


def test_the_export_of_a_llama_model_is_llamas_layout(tmp_path):
    from safetensors.numpy import load_file

    write_run(tmp_path / "run", *MODELS["llama-untied"], "model.rope_theta=500")
    export(tmp_path / "run", tmp_path / "export")
    config = json.loads((tmp_path / "export" / CONFIG_FILE).read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim")
    assert [config[k] for k in sizes] == [32, 2, 4, 2, 8]
    # SwiGLU's hidden size: two thirds of 4 x 32, rounded up to a multiple of 64.
    assert config["intermediate_size"] == 128 and config["max_position_embeddings"] == 64
    assert (config["rms_norm_eps"], config["rope_theta"], config["hidden_act"]) == (1e-6, 500.0, "silu")
    assert config["attention_bias"] is False and config["mlp_bias"] is False and config["tie_word_embeddings"] is False
    tensors = load_file(str(tmp_path / "export" / WEIGHTS_FILE))
    # torch's Linear is [out, in]: dlc's kernels transposed. Keys and values have 2 heads of 8.
    block = {
        "input_layernorm.weight": (32,),
        "self_attn.q_proj.weight": (32, 32),
        "self_attn.k_proj.weight": (16, 32),
        "self_attn.v_proj.weight": (16, 32),
        "self_attn.o_proj.weight": (32, 32),
        "post_attention_layernorm.weight": (32,),
        "mlp.gate_proj.weight": (128, 32),
        "mlp.up_proj.weight": (128, 32),
        "mlp.down_proj.weight": (32, 128),
    }
    expected = {"model.embed_tokens.weight": (256, 32), "model.norm.weight": (32,), "lm_head.weight": (256, 32)}
    expected |= {f"model.layers.{i}.{name}": shape for i in range(2) for name, shape in block.items()}
    assert {name: tensor.shape for name, tensor in tensors.items()} == expected
    model = load_run_model(tmp_path / "run")
    params = model.params["blocks"][1]
    np.testing.assert_array_equal(tensors["model.layers.1.self_attn.k_proj.weight"], params["attn"]["k"]["kernel"].T)
    np.testing.assert_array_equal(tensors["model.layers.1.mlp.down_proj.weight"], params["mlp"]["down"]["kernel"].T)
    np.testing.assert_array_equal(tensors["lm_head.weight"], model.params["head"]["kernel"].T)
    tied = tmp_path / "tied"
    write_run(tied / "run", *MODELS["llama-tied"])
    export(tied / "run", tied / "export")
    assert "lm_head.weight" not in load_file(str(tied / "export" / WEIGHTS_FILE))


@pytest.mark.parametrize("overrides", [MODELS[k] for k in TRANSFORMERS], ids=TRANSFORMERS)
def test_transformers_loads_the_export_and_computes_the_same_logits(overrides, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    # init_std 0.1: logits of a few units that depend on every position, so that keys and values grouped
    # or rotated otherwise than transformers does would be off by ~0.4, not by the ~2e-3 of the default.
    write_run(tmp_path / "run", *overrides, "model.init_std=0.1")
    export(tmp_path / "run", tmp_path / "export")
    model = load_export(tmp_path / "export")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "export"))
    cfg = model.recipe.model
    assert type(hf).__name__ == ("LlamaForCausalLM" if cfg.arch == "llama" else "GPT2LMHeadModel")
    x = tokens(256, cfg.context_len)
    with torch.no_grad():
        theirs = hf(torch.tensor(x, dtype=torch.long)).logits.numpy()
    ours = np.asarray(apply_model(model.graphdef, model.params, x))
    np.testing.assert_allclose(theirs, ours, atol=1e-4)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "export"))
    assert tokenizer("def héllo", add_special_tokens=False)["input_ids"] == list("def héllo".encode())


def test_export_replaces_an_earlier_one_only_when_asked(tmp_path):
    write_run(tmp_path / "run")
    export(tmp_path / "run", tmp_path / "export", "--checkpoint", "10")
    assert_user_error(
        invoke("export", str(tmp_path / "run"), "--out", str(tmp_path / "export")),
        "holds an export already",
        "--overwrite",
    )
    assert "checkpoint 10" in load_export(tmp_path / "export").source
    export(tmp_path / "run", tmp_path / "export", "--overwrite")
    assert "checkpoint 20" in load_export(tmp_path / "export").source
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "run"]  # nothing half-written beside them


def test_an_export_cut_short_leaves_nothing(tmp_path, monkeypatch):
    import safetensors.numpy

    write_run(tmp_path / "run")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.numpy, "save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        from dlc.use.export import export_model

        export_model(load_run_model(tmp_path / "run"), tmp_path / "export")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def _damage(path, name: str, data: bytes) -> None:
    (path / name).write_bytes(data)


BAD = [
    ("out-is-a-file", lambda t: (t / "f").write_text("x"), ["export", "{run}", "--out", "{tmp}/f"], ["is a file"]),
    (
        "out-is-a-link",
        lambda t: (t / "empty").mkdir() or (t / "link").symlink_to(t / "empty"),
        ["export", "{run}", "--out", "{tmp}/link"],
        ["is a symbolic link"],
    ),
    (
        "out-cannot-be-written",
        lambda t: (t / "f").write_text("x"),
        ["export", "{run}", "--out", "{tmp}/f/e"],
        ["cannot write --out", "writable directory"],
    ),
    (
        "out-holds-other-files",
        lambda t: (t / "d").mkdir() or (t / "d" / "notes.txt").write_text("x"),
        ["export", "{run}", "--out", "{tmp}/d"],
        ["not a dlc export", "new directory"],
    ),
    ("damaged-record", lambda t: _damage(t / "export", DLC_FILE, b"{"), ["eval", "{tmp}/export"], ["is damaged"]),
    (
        "damaged-weights",
        lambda t: _damage(t / "export", WEIGHTS_FILE, b"\x10\x00"),
        ["sample", "{tmp}/export"],
        ["cannot be read", "export the run again"],
    ),
    ("checkpoint-of-an-export", lambda t: None, ["sample", "{tmp}/export", "--checkpoint", "10"], ["is an export"]),
]


@pytest.mark.parametrize(("damage", "args", "fragments"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_exports_are_refused_in_one_line(damage, args, fragments, tmp_path):
    write_run(tmp_path / "run")
    export(tmp_path / "run", tmp_path / "export")
    damage(tmp_path)
    args = [a.format(run=tmp_path / "run", tmp=tmp_path) for a in args]
    assert_user_error(invoke(*args), *fragments)


def test_a_run_without_a_checkpoint_has_nothing_to_export(tmp_path):
    write_run(tmp_path / "early", syncer_steps=())
    assert_user_error(
        invoke("export", str(tmp_path / "early"), "--out", str(tmp_path / "e")), "no checkpoint in", "not saved one yet"
    )
    assert not (tmp_path / "e").exists()


def test_a_damaged_checkpoint_is_one_line_and_no_traceback(tmp_path):
    # In a fresh interpreter: orbax's reads abandoned by the failed restore report themselves at exit.
    write_run(tmp_path / "run")
    for chunk in (tmp_path / "run" / "checkpoints" / "syncer" / "20" / "state").rglob("d/*"):
        chunk.write_bytes(b"garbage")
    result = run_cli("export", str(tmp_path / "run"), "--out", str(tmp_path / "e"))
    assert_user_error(result, "checkpoint", "syncer/20 is unreadable")
    assert "Event loop" not in result.stderr and not (tmp_path / "e").exists()
