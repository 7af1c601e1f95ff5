"""The syncer's process and its evaluator: the actor, its journal, its reports to the driver, evaluations."""
