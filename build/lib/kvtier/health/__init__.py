"""`kvtier health`: every tier of a running cluster checked as its clients see it, all at once, read-only."""
