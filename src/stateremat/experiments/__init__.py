"""stateremat.experiments (see DESIGN.md, layer `experiments`)."""
