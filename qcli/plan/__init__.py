"""The plan, made from the headers alone.

`options` holds what it is asked for (`PlanOptions`) and `entries` its data (`Decision`, `PlanEntry`, `Totals`,
`Plan`). `decisions` decides each tensor (`make_plan`, `plan_by_name`, `make_checked_plan`), and `checks` finds
the problems in the decisions."""
