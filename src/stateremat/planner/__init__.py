"""stateremat.planner (see DESIGN.md, layer `planner`)."""
