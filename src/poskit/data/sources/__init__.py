"""Where each corpus's raw documents come from (one module per source)."""
