"""stateremat.workloads (see DESIGN.md, layer `workloads`)."""
