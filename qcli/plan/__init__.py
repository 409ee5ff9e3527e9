"""The plan, from the headers alone: its data (`entries`: `Decision`, `PlanEntry`, `Totals`, `Plan`), the decision
for each tensor (`decisions`: `make_plan`, the shape helpers), and the problems found in them (`checks`)."""
