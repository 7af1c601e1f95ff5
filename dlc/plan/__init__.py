"""Answers without training: goodput at scale, WAN bandwidth, what a recipe needs before it runs."""
