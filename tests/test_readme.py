from pathlib import Path

from dlc.config.reference import reference_markdown

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_recipe_reference_is_current():
    # Regenerate with: python -c "from dlc.config.reference import reference_markdown; print(reference_markdown())"
    assert reference_markdown() in README.read_text()


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert block == ["pip install -e . && dlc train recipes/tiny.yaml", "pip install -e '.[test]' && pytest"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert block[1] in ci


def test_readme_chaos_plan_reference_is_current():
    from chaos.plan import reference_markdown as plan_reference

    assert plan_reference() in README.read_text()
