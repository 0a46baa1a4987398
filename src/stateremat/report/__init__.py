"""stateremat.report (see DESIGN.md, layer `report`)."""
