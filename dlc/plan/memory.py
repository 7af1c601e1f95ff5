"""What a recipe needs before anything is allocated: its fragments and its memory.

`dlc train` asks here before it reads the corpus or starts a process, so a recipe too large for
the machine is refused with the memory it would need instead of ending in an out-of-memory
traceback inside a learner; `dlc bandwidth --recipe` takes the fragments from here. The model's
arrays come from the model itself (`dlc.core.abstract`: `jax.eval_shape`, nothing allocated, no
device touched); JAX is imported when a plan is asked for, not with this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlc.config.schema import Recipe
from dlc.core.fragments import FragmentPlan
from dlc.errors import UserError
from dlc.units import MIB, format_bytes

FLOAT_BYTES = 4  # parameters, optimizer state, anchors and fragments are float32
# Python, NumPy, JAX, XLA's compiled functions and Ray's worker in one process. Measured on a run
# of tiny (peak RSS, shared libraries counted in each): learners 490 MiB, of which about 60 MiB is
# their state and activations; the syncer 410 MiB; the evaluator 340 MiB.
PROCESS_BYTES = 512 * MIB
# The embedded cluster's own processes: GCS, raylet, the dashboard and runtime-env agents.
RAY_BYTES = 512 * MIB
# Besides its anchors (one padded vector per fragment), a learner holds a fragment being pushed: its
# outer gradient and the parameters it was sent from (adopt=rebase).
PUSH_BUFFERS = 2
# The syncer holds the global model and its outer momentum as fragments, the model it was built
# from, the decoded pushes of a round and the learners' last versions for int downlinks.
SYNCER_COPIES = 6
# The evaluator builds the model and unflattens each snapshot of the global model into a second.
EVALUATOR_COPIES = 2


def fragment_plan(recipe: Recipe) -> FragmentPlan:
    """The fragments the recipe's algorithm syncs; UserError when the model cannot be cut into them."""
    from dlc.algo import get_algorithm
    from dlc.core.abstract import param_count, param_shapes

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
    """Bytes each process of a run needs: the model's arrays read from the model, a generous
    constant for the rest."""

    params: int
    batch: int  # the largest batch a learner on this machine's CPUs steps
    padded_fragment: int  # values of a fragment as the devices hold it, padded to the codec's blocks
    learner_state: int  # parameters and AdamW's state, all the learner's devices together
    learner_activations: int  # what the forward pass keeps for the backward pass
    learner_fragments: int  # anchors and push buffers (`PUSH_BUFFERS`), on every device
    learner_processes: int  # learners and hot spares on this machine's CPUs
    syncer: int
    evaluator: int

    @property
    def learner(self) -> int:
        return PROCESS_BYTES + self.learner_state + self.learner_activations + self.learner_fragments

    @property
    def total(self) -> int:
        return RAY_BYTES + self.learner_processes * self.learner + self.syncer + self.evaluator


def footprint(recipe: Recipe) -> Footprint:
    """The memory a run of `recipe` needs on this machine (learners on GPUs keep their state there).

    The largest of this machine's CPU learners stands for all of them.
    """
    from dlc.core.abstract import activation_bytes, learner_arrays, param_count

    learners = recipe.learners
    n = param_count(recipe.model)
    plan = fragment_plan(recipe)
    quantum = recipe.syncer.codec_block_values if recipe.syncer.codec in ("int4", "int8") else 2
    padded = -(-max(plan.size(p) for p in range(plan.num_fragments)) // quantum) * quantum
    on_cpu = [i for i in range(learners.count) if learners.resolved(i).num_gpus == 0]
    spares = learners.spares if learners.num_gpus == 0 else 0
    arrays = [learner_arrays(recipe, i) for i in on_cpu]
    largest = max(range(len(arrays)), key=lambda k: arrays[k].state + arrays[k].activations, default=None)
    devices = learners.resolved(on_cpu[largest]).devices if largest is not None else 0
    eval_windows = 2 * FLOAT_BYTES * recipe.eval.batches * recipe.eval.batch_size * (learners.seq_len + 1)
    # A forward pass keeps one block's activations at a time: a one-block model's saved activations
    # (embeddings, the block, the logits) are a generous bound; on a GPU they are the GPU's.
    one_block = recipe.model.model_copy(update={"num_layers": 1})
    eval_forward = recipe.eval.batch_size * activation_bytes(one_block, learners.seq_len)
    if recipe.eval.num_gpus > 0:
        eval_forward = 0
    return Footprint(
        params=n,
        batch=max((learners.resolved(i).batch_size for i in on_cpu), default=0),
        padded_fragment=padded,
        learner_state=arrays[largest].state if largest is not None else 0,
        learner_activations=arrays[largest].activations if largest is not None else 0,
        learner_fragments=devices * FLOAT_BYTES * (plan.num_fragments + PUSH_BUFFERS) * padded,
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
        f"{format_bytes(need.learner)} each ({need.params:,} parameters with AdamW's two moments = "
        f"{format_bytes(need.learner_state)}; activations of batch {need.batch} x seq {recipe.learners.seq_len} "
        f"x width {model.width} x {model.num_layers} layers = {format_bytes(need.learner_activations)}; anchors "
        f"and fragments padded to {need.padded_fragment:,} values = "
        f"{format_bytes(need.learner_fragments)}), the syncer {format_bytes(need.syncer)}, the evaluator "
        f"{format_bytes(need.evaluator)} and Ray {format_bytes(RAY_BYTES)}: lower model.width, model.num_layers "
        "or model.context_len, "
        "learners.batch_size, learners.seq_len or learners.count, eval.batches or eval.batch_size, "
        "or syncer.codec_block_values"
        + ("; or set model.remat=block (activations recomputed)" if model.remat == "none" else "")
    )
