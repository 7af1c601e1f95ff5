"""The `dlc` command line: thin Typer commands that parse, load the recipe and call one function."""
