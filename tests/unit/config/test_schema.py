import pytest

from dlc.config.algorithms import ALGORITHM_NAMES, BANDWIDTH_APPROACHES, SIMULATED_SYSTEMS
from dlc.config.load import load_recipe, parse_overrides
from dlc.config.schema import Recipe
from dlc.errors import UserError
from tests.helpers import REPO


def test_shipped_recipes_load():
    for path in sorted((REPO / "recipes").glob("*.yaml")):
        assert isinstance(load_recipe(path), Recipe)


def test_override_parsing_types():
    tree = parse_overrides(["run.dir=/tmp/r1", "learners.count=2", "inner.lr=1e-3", "data.paths=[a, b]"])
    assert tree == {
        "run": {"dir": "/tmp/r1"},
        "learners": {"count": 2},
        "inner": {"lr": 1e-3},
        "data": {"paths": ["a", "b"]},
    }


def test_overrides_apply(tmp_path):
    r = load_recipe(REPO / "recipes/tiny.yaml", ["run.dir=/tmp/r1", "learners.batch_size=4", "model.width=32"])
    assert r.run.dir == "/tmp/r1" and r.learners.batch_size == 4 and r.model.width == 32
    assert r.model.num_layers == 4  # untouched keys keep the recipe's value


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["learners.batchsize=4"], "unknown key learners.batchsize: did you mean learners.batch_size?"),
        (["modle.width=4"], "unknown key modle: did you mean model?"),
        (["learners.count=0"], "learners.count=0: Input should be greater than or equal to 1"),
        (["model.num_heads=3"], "model.num_heads=3 does not divide model.width=64"),
        (["syncer.weighting=tokens_per_step"], "is now called tokens_squared_per_step"),
        (["learners.seq_len=512"], "learners.seq_len=512 is longer than model.context_len=64"),
        (["data.source=web"], "data.source='web'"),
        (["run.max_steps=null"], "no stop condition"),
        (["learners.count"], "is not key=value"),
        (["data.source=text"], "data.source=text needs data.paths"),
        (["learners.num_gpus=2"], "learners: num_gpus=2 but devices=1: a learner on N GPUs trains on N devices"),
        (
            ["learners.overrides=[{index: 1, num_gpus: 1.5}]"],
            "learners.overrides[index=1].num_gpus=1.5: a learner takes a share of one GPU or whole GPUs",
        ),
        (
            ["learners.overrides=[{index: 2, accelerator_type: H100}]"],
            "learners.overrides[index=2].accelerator_type='H100' but learner 2 reserves no GPU: give it num_gpus",
        ),
        (["eval.num_gpus=2"], "eval.num_gpus=2: Input should be less than or equal to 1"),
        (["track=[tensorboard,comet]"], "track.1='comet': Input should be 'tensorboard', 'wandb' or 'mlflow'"),
        (["track=[wandb,mlflow,wandb]"], "track lists wandb more than once: name each tracker once"),
        (["tracking.wandb_mode=cloud"], "tracking.wandb_mode='cloud': Input should be 'online' or 'offline'"),
        (["tracking.projekt=x"], "unknown key tracking.projekt: did you mean tracking.project?"),
    ],
)
def test_bad_values_name_field_and_fix(overrides, message):
    with pytest.raises(UserError) as err:
        load_recipe(REPO / "recipes/tiny.yaml", overrides)
    assert message in str(err.value)


def test_trackers_from_the_command_line():
    assert load_recipe(REPO / "recipes/tiny.yaml").track == ["tensorboard"]  # as before trackers were chosen
    assert load_recipe(REPO / "recipes/tiny.yaml", ["track=[tensorboard,mlflow]"]).track == ["tensorboard", "mlflow"]
    assert load_recipe(REPO / "recipes/tiny.yaml", ["track=wandb"]).track == ["wandb"]  # one name, no brackets
    assert load_recipe(REPO / "recipes/tiny.yaml", ["track=[]"]).track == []
    r = load_recipe(REPO / "recipes/tiny.yaml", ["tracking.wandb_mode=offline", "tracking.mlflow_uri=http://h:5000"])
    assert (r.tracking.wandb_mode, r.tracking.mlflow_uri, r.tracking.project) == ("offline", "http://h:5000", "dlc")


def test_wall_time_only_needs_schedule_length():
    with pytest.raises(UserError, match="set inner.schedule_steps"):
        load_recipe(REPO / "recipes/tiny.yaml", ["run.max_steps=null", "run.max_wall_s=60"])
    r = load_recipe(REPO / "recipes/tiny.yaml", ["run.max_steps=null", "run.max_tokens=40960"])
    # 40960 tokens / (4 learners * 16 sequences * 64 tokens per step) = 10 steps per learner
    assert r.schedule_steps() == 10


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_recipe(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [unclosed")
    with pytest.raises(UserError, match="not valid YAML"):
        load_recipe(bad)
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(UserError, match="bare list .* not a mapping of sections"):
        load_recipe(tmp_path / "list.yaml")


def test_every_field_is_documented():
    def walk(model):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            ann = field.annotation
            for c in (ann, *getattr(ann, "__args__", ())):
                if isinstance(c, type) and hasattr(c, "model_fields"):
                    walk(c)

    walk(Recipe)


def test_xla_threads_follow_the_cpus_a_learner_reserves_unless_set():
    learners = Recipe.model_validate(
        {"learners": {"count": 3, "overrides": [{"index": 1, "num_cpus": 4}, {"index": 2, "num_cpus": 0.5}]}}
    ).learners
    # Learner 0 reserves the default 1 CPU; a spare or the evaluator (None) as much as the default.
    assert [learners.xla_threads(i) for i in (0, 1, 2, None)] == [1, 4, 1, 1]
    pinned = Recipe.model_validate({"learners": {"xla_cpu_threads": 2, "overrides": [{"index": 0, "num_cpus": 8}]}})
    assert [pinned.learners.xla_threads(i) for i in (0, 1, None)] == [2, 2, 2]


def test_one_vocabulary_of_algorithms():
    from dlc.algo import ALGORITHMS as REGISTRY

    assert sorted(REGISTRY) == sorted(ALGORITHM_NAMES)  # dlc train runs each declared algorithm
    with pytest.raises(UserError, match="Input should be 'decoupled', 'diloco', 'dp' or 'none'"):
        load_recipe(REPO / "recipes/tiny.yaml", ["algorithm=fedavg"])
    # The planning tools' own names each model one of them (and stay the names they print).
    assert [(v.name, v.algorithm) for v in SIMULATED_SYSTEMS] == [
        ("dp", "dp"),
        ("elastic_dp", "dp"),
        ("decoupled", "decoupled"),
    ]
    assert {v.algorithm for v in BANDWIDTH_APPROACHES} == {"dp", "diloco", "decoupled"}


def test_the_outer_step_is_chosen_by_kind_and_old_recipes_still_read():
    from dlc.config.load import load_recipe
    from dlc.errors import UserError

    outer = load_recipe("recipes/tiny.yaml", ["syncer.outer.kind=delayed_nesterov", "syncer.outer.lr=0.7"]).syncer.outer
    assert (outer.kind, outer.lr, outer.momentum, outer.delay_rounds) == ("delayed_nesterov", 0.7, 0.0, 4)
    # The kind changes, the fields the recipe gave stay (tiny.yaml: momentum 0); no kind is Nesterov.
    assert Recipe.model_validate({"syncer": {"outer": {"lr": 0.5}}}).syncer.outer.kind == "nesterov"
    legacy = Recipe.model_validate({"syncer": {"outer_lr": 0.7, "outer_momentum": 0.9}}).syncer.outer
    assert (legacy.kind, legacy.lr, legacy.momentum) == ("nesterov", 0.7, 0.9)
    with pytest.raises(UserError, match="syncer.outer_lr and syncer.outer both set"):
        load_recipe("recipes/tiny.yaml", ["syncer.outer_lr=0.5"])
    with pytest.raises(UserError, match="unknown key syncer.outer.delay_rounds: valid keys here: kind, lr, momentum"):
        load_recipe("recipes/tiny.yaml", ["syncer.outer.delay_rounds=2"])
    with pytest.raises(UserError, match="unknown outer step: choose kind from nesterov, delayed_nesterov"):
        load_recipe("recipes/tiny.yaml", ["syncer.outer.kind=adam"])
