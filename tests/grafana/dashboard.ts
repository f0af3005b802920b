// The shape a memtrace dashboard must have, written only in Grafana's own published types:
// @grafana/schema (generated from the CUE kinds in Grafana's repository: the classic dashboard
// model, and each panel plugin's options and field config) and, for the Prometheus queries
// that @grafana/schema no longer ships, @grafana/grafana-foundation-sdk's prometheus kind.
//
// Two things are added on top, and nothing is loosened:
// - Json<T> turns each TypeScript string enum into the union of its values, since the JSON
//   file holds "table", not LegendDisplayMode.Table. Numeric enums stay as they are (a JSON
//   number is checked against their values).
// - The panels are a union discriminated by `type`: a panel of a type not listed here is an
//   error, and a listed type is checked against that plugin's Options and FieldConfig
//   instead of the generic Record<string, unknown>. Add a member when the generator starts
//   using another panel type.
import type * as schema from '@grafana/schema';
import type * as timeseries from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';
import type * as bargauge from '@grafana/schema/dist/esm/raw/composable/bargauge/panelcfg/x/BarGaugePanelCfg_types.gen';
import type * as prometheus from '@grafana/grafana-foundation-sdk/prometheus';

type IsAny<T> = 0 extends 1 & T ? true : false;

export type Json<T> =
  IsAny<T> extends true ? T
  : unknown extends T ? T
  : T extends string ? `${T}`
  : T extends number | boolean | null | undefined ? T
  : T extends (...args: never[]) => unknown ? never
  : T extends ReadonlyArray<infer U> ? Array<Json<U>>
  : { [K in keyof T]: Json<T[K]> };

// The SDK's query types carry a marker method for its builders; JSON has none.
export type PrometheusQuery = Json<Omit<prometheus.Dataquery, '_implementsDataqueryVariant'>>;

// A panel whose options, field config and queries are those of one plugin. The common
// panel fields (gridPos, id, title, datasource, links, ...) stay as schema.Panel has them.
// A plugin whose kind declares no FieldConfig takes no `custom` field config at all.
type PluginPanel<Type extends string, Options, Custom = never> =
  Omit<Json<schema.Panel>, 'type' | 'options' | 'fieldConfig' | 'targets'> & {
    type: Type;
    options: Json<Options>;
    fieldConfig: Omit<Json<schema.FieldConfigSource>, 'defaults'> & {
      defaults: Omit<Json<schema.FieldConfig>, 'custom'> & { custom?: Json<Custom> };
    };
    targets: PrometheusQuery[];
  };

export type TimeSeriesPanel = PluginPanel<'timeseries', timeseries.Options, timeseries.FieldConfig>;
export type BarGaugePanel = PluginPanel<'bargauge', bargauge.Options>;

export type RowPanel = Omit<Json<schema.RowPanel>, 'panels'> & { panels: QueryPanel[] };
export type QueryPanel = TimeSeriesPanel | BarGaugePanel;

export type Dashboard = Omit<Json<schema.Dashboard>, 'panels'> & {
  panels: Array<QueryPanel | RowPanel>;
};
