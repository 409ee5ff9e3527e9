"""The plan, from the headers alone: what it is asked for (`options`: `PlanOptions`), its data (`entries`:
`Decision`, `PlanEntry`, `Totals`, `Plan`), the decision for each tensor (`decisions`: `make_plan`, `plan_by_name`,
`make_checked_plan`, the shape helpers), and the problems found in them (`checks`)."""
