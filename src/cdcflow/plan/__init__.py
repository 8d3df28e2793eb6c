"""Engine-neutral CDC plan: validation rules, duplicate classification, fold and MERGE spec."""
