"""Phase 2 analysis: weight distances between sibling runs, growth fits, the study report."""
