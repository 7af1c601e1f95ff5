"""What a recipe needs before anything is allocated: its fragments and its memory.

`dlc train` asks here before it reads the corpus or starts a process, so a recipe too large for
the machine is refused with the memory it would need instead of ending in an out-of-memory
traceback inside a learner; `dlc bandwidth --recipe` takes the fragments from here, so it allocates
nothing at all. The model's shapes come from `dlc.core.shapes`, so nothing here imports JAX.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlc.config.schema import Recipe
from dlc.config.workload import ModelConfig
from dlc.core.fragments import FragmentPlan
from dlc.core.shapes import head_dim, kv_heads, mlp_hidden, param_count, param_shapes, vocab_size
from dlc.errors import UserError
from dlc.units import MIB, format_bytes

FLOAT_BYTES = 4  # parameters, optimizer state, anchors and fragments are float32; activations model.compute_dtype
# Python, NumPy, JAX, XLA's compiled functions and Ray's worker in one process. Measured on a run
# of tiny (peak RSS, shared libraries counted in each): learners 490 MiB, of which about 60 MiB is
# their state and activations; the syncer 410 MiB; the evaluator 340 MiB.
PROCESS_BYTES = 512 * MIB
# The embedded cluster's own processes: GCS, raylet, the dashboard and runtime-env agents.
RAY_BYTES = 512 * MIB
# A learner holds its parameters, gradients, AdamW's two moments, its anchors, and the step's
# new parameters while the donated old ones are released: six float32 copies of the model.
LEARNER_COPIES = 6
# The syncer holds the global model and its outer momentum as fragments, the model it was built
# from, the decoded pushes of a round and the learners' last versions for int downlinks.
SYNCER_COPIES = 6
# The evaluator builds the model and unflattens each snapshot of the global model into a second.
EVALUATOR_COPIES = 2


def fragment_plan(recipe: Recipe) -> FragmentPlan:
    """The fragments the recipe's algorithm syncs; UserError when the model cannot be cut into them."""
    from dlc.algo import get_algorithm

    fragments = get_algorithm(recipe.algorithm).traffic(recipe).fragments
    shapes = param_shapes(recipe.model)
    problem = UserError(
        f"syncer.fragments={fragments} is more than the model's {len(shapes)} tensors can be cut into "
        f"(a fragment holds whole rows; {param_count(recipe.model):,} parameters): lower syncer.fragments"
    )
    # A fragment needs a row of its own: more fragments than rows never fit (and would take long to try).
    if fragments > sum(shape[0] for shape in shapes.values()):
        raise problem
    try:
        return FragmentPlan.build(shapes, fragments)
    except ValueError:
        raise problem from None


@dataclass(frozen=True)
class Footprint:
    """Bytes each process of a run needs, by a rough but generous count."""

    params: int
    batch: int  # the largest batch a learner on this machine's CPUs steps
    padded_fragment: int  # values of a fragment as the devices hold it, padded to the codec's blocks
    learner_state: int  # parameters, gradients, AdamW moments, anchors, the step's output
    learner_activations: int  # what the forward pass keeps for the backward pass, and its gradients
    learner_fragments: int  # the device's fragment index table and push buffers
    learner_processes: int  # learners and hot spares on this machine's CPUs
    syncer: int
    evaluator: int

    @property
    def learner(self) -> int:
        return PROCESS_BYTES + self.learner_state + self.learner_activations + self.learner_fragments

    @property
    def total(self) -> int:
        return RAY_BYTES + self.learner_processes * self.learner + self.syncer + self.evaluator


def _activation_bytes(batch: int, seq: int, model: ModelConfig) -> int:
    """Bytes one forward pass of `batch` x `seq` keeps, in model.compute_dtype: per token and block, the
    residual, two norms, the attention's projections and output (GPT: q/k/v from one matrix; Llama: q,
    k and v, keys and queries again rotated), the MLP's hidden layers (GELU: before and after it;
    SwiGLU: gate, up, silu(gate) and their product); per sequence and head the attention scores and
    probabilities; at the end the logits, which are float32 whatever the compute dtype."""
    d, hidden, width = model.width, mlp_hidden(model), 2 if model.compute_dtype == "bfloat16" else FLOAT_BYTES
    if model.arch == "llama":
        kv = kv_heads(model) * head_dim(model)
        per_token_block = 7 * d + 3 * kv + 4 * hidden
    else:
        per_token_block = 8 * d + 2 * hidden
    per_block = batch * seq * per_token_block + 2 * batch * model.num_heads * seq * seq
    return width * (model.num_layers * per_block + 2 * batch * seq * d) + FLOAT_BYTES * 3 * batch * seq * vocab_size(
        model
    )


def footprint(recipe: Recipe) -> Footprint:
    """The memory a run of `recipe` needs on this machine (learners on GPUs keep their state there)."""
    model, learners = recipe.model, recipe.learners
    n = param_count(model)
    plan = fragment_plan(recipe)
    quantum = recipe.syncer.codec_block_values if recipe.syncer.codec in ("int4", "int8") else 2
    padded = -(-max(plan.size(p) for p in range(plan.num_fragments)) // quantum) * quantum
    on_cpu = [i for i in range(learners.count) if learners.resolved(i).num_gpus == 0]
    spares = learners.spares if learners.num_gpus == 0 else 0
    batch = max((learners.resolved(i).batch_size for i in on_cpu), default=0)
    seq = learners.seq_len
    # Gradients of the activations are as large as the activations: count them twice.
    activations = 2 * _activation_bytes(batch, seq, model) if on_cpu else 0
    eval_windows = 2 * FLOAT_BYTES * recipe.eval.batches * recipe.eval.batch_size * (seq + 1)
    eval_forward = _activation_bytes(recipe.eval.batch_size, seq, model)
    return Footprint(
        params=n,
        batch=batch,
        padded_fragment=padded,
        learner_state=LEARNER_COPIES * FLOAT_BYTES * n if on_cpu else 0,
        learner_activations=activations,
        learner_fragments=FLOAT_BYTES * (plan.num_fragments * padded + 4 * padded) if on_cpu else 0,
        learner_processes=len(on_cpu) + spares,
        syncer=PROCESS_BYTES + SYNCER_COPIES * FLOAT_BYTES * n + 4 * FLOAT_BYTES * padded,
        evaluator=PROCESS_BYTES + EVALUATOR_COPIES * FLOAT_BYTES * n + eval_windows + eval_forward,
    )


def available_bytes() -> int:
    """Memory this machine can give a new process now, without swapping."""
    import psutil

    return int(psutil.virtual_memory().available)


def check_fits(recipe: Recipe, available: int | None = None) -> Footprint:
    """Refuse, before anything is allocated, a run that cannot fit in this machine's memory.

    Only the embedded cluster runs its processes here; with `cluster.address` they run where Ray
    places them, and only the fragment plan is checked.
    """
    need = footprint(recipe)
    if recipe.cluster.address is not None:
        return need
    available = available_bytes() if available is None else available
    if need.total <= available:
        return need
    model = recipe.model
    raise UserError(
        f"this run needs about {format_bytes(need.total)} of memory and this machine has "
        f"{format_bytes(available)} available: {need.learner_processes} learner process(es) of "
        f"{format_bytes(need.learner)} each ({need.params:,} parameters x {LEARNER_COPIES} float32 copies for "
        f"weights, gradients, AdamW and anchors = {format_bytes(need.learner_state)}; activations of batch "
        f"{need.batch} x seq {recipe.learners.seq_len} x width {model.width} x {model.num_layers} layers = "
        f"{format_bytes(need.learner_activations)}; fragments padded to {need.padded_fragment:,} values = "
        f"{format_bytes(need.learner_fragments)}), the syncer {format_bytes(need.syncer)}, the evaluator "
        f"{format_bytes(need.evaluator)} and Ray {format_bytes(RAY_BYTES)}: lower model.width, model.num_layers "
        "or model.context_len, "
        "learners.batch_size, learners.seq_len or learners.count, eval.batches or eval.batch_size, "
        "or syncer.codec_block_values"
    )
