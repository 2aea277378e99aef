"""Experiments: one script per question, each with a `main(argv)` that tests call at a tiny size.
Results go under results/ (git-ignored)."""
