"""Builds the Grafana dashboard of a loraplane fleet with grafana-foundation-sdk.

    python -m deploy.grafana.build            # writes deploy/grafana/loraplane.json
    python -m deploy.grafana.build --check    # exits 1 if the committed file is stale

The queries are in ``queries.py``; import the JSON in Grafana (Dashboards, New, Import)
and pick the Prometheus data source that scrapes the registry and the agents.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common, dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.common import (
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    TooltipDisplayMode,
)
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from deploy.grafana.queries import ROWS, PanelSpec

OUTPUT = Path(__file__).with_name("loraplane.json")
UID = "loraplane-fleet"
# The data source is a variable, so the dashboard imports against any Prometheus.
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


def _panel(spec: PanelSpec, panel_id: int) -> timeseries.Panel:
    # A table legend with the last and largest values: one line per adapter, sortable.
    legend = (common.VizLegendOptions().display_mode(LegendDisplayMode.TABLE)
              .placement(LegendPlacement.RIGHT).show_legend(True).calcs(["lastNotNull", "max"]))
    panel = (timeseries.Panel().id(panel_id).title(spec.title).description(spec.description)
             .unit(spec.unit).datasource(DATASOURCE).height(8).span(12).legend(legend)
             .tooltip(common.VizTooltipOptions().mode(TooltipDisplayMode.MULTI)
                      .sort(SortOrder.DESCENDING)))
    for ref, query in zip("ABCDEFGH", spec.queries, strict=False):
        panel = panel.with_target(prometheus.Dataquery().expr(query.expr)
                                  .legend_format(query.legend).ref_id(ref))
    return panel


def build() -> model.Dashboard:
    board = (dashboard.Dashboard("loraplane").uid(UID)
             .description("Adapters, the fleet's convergence and the outbox "
                          "(built by deploy/grafana/build.py)")
             .tags(["loraplane"]).refresh("30s").time("now-3h", "now").timezone("browser")
             .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus")
                            .type("prometheus")))
    next_id = 1
    for title, panels in ROWS:
        board = board.with_row(dashboard.Row(title).id(next_id))
        next_id += 1
        for spec in panels:
            board = board.with_panel(_panel(spec, next_id))
            next_id += 1
    return board.build()


def render() -> str:
    return json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed file instead of writing it")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run python -m deploy.grafana.build", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
