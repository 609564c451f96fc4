"""Control: how much to speculate (cost-aware sizing now; the Cascade controller later)."""
