"""Drafter training: data generation by the target itself, (later) training
and offline evaluation. See DSPARK.md section 2."""
