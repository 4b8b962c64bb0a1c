/**
 * The type every generated tokenstamp dashboard must satisfy.
 *
 * Grafana's published dashboard schema (`@grafana/schema`), with each panel's
 * `options` and `fieldConfig.defaults.custom` typed by its panel plugin's
 * schema (the schema itself leaves them `Record<string, unknown>`), and every
 * query typed as a Prometheus query. `dashboards/schema_check.py` writes one
 * `.ts` file per dashboard that assigns the dashboard's JSON to a constant of
 * this type, and runs `tsc --noEmit --strict`: a wrong field type, a missing
 * required field or an unknown field (excess property) is a compile error.
 */
import type {
  AnnotationQuery,
  Dashboard,
  DataQuery,
  DataSourceRef,
  FieldConfig,
  FieldConfigSource,
  Panel,
  RowPanel,
  VariableModel,
} from '@grafana/schema';
import type {
  FieldConfig as HeatmapFieldConfig,
  Options as HeatmapOptions,
} from '@grafana/schema/dist/esm/raw/composable/heatmap/panelcfg/x/HeatmapPanelCfg_types.gen';
import type { Options as StatOptions } from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen';
import type {
  FieldConfig as TableFieldConfig,
  Options as TableOptions,
} from '@grafana/schema/dist/esm/raw/composable/table/panelcfg/x/TablePanelCfg_types.gen';
import type {
  FieldConfig as TimeSeriesFieldConfig,
  Options as TimeSeriesOptions,
} from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';

/**
 * A schema type as JSON spells it. JSON holds an enum member as its plain
 * value, so every string enum becomes the union of its values (`"list"` for
 * `LegendDisplayMode.List`); numeric enums already accept their number values.
 */
export type Json<T> = T extends string
  ? `${T}`
  : T extends number | boolean | null | undefined
    ? T
    : T extends ReadonlyArray<infer U>
      ? Array<Json<U>>
      : T extends object
        ? { [K in keyof T]: Json<T[K]> }
        : T;

/**
 * A Prometheus query as the Prometheus data source stores it (Grafana's
 * `PromQuery`; that data source's query model is not part of `@grafana/schema`).
 */
export type PromQuery = Omit<Json<DataQuery>, 'datasource'> & {
  datasource: Json<DataSourceRef>;
  expr: string;
  legendFormat?: string;
  format?: 'time_series' | 'table' | 'heatmap';
  instant?: boolean;
  range?: boolean;
  exemplar?: boolean;
  interval?: string;
  editorMode?: 'code' | 'builder';
};

type FieldConfigOf<Custom> = {
  defaults: Omit<Json<FieldConfig>, 'custom'> & { custom?: Json<Custom> };
  overrides: Json<FieldConfigSource['overrides']>;
};

/** A panel of plugin `Type` with that plugin's options and custom field config. */
export type PanelOf<Type extends string, Options, Custom> = Omit<
  Json<Panel>,
  'type' | 'options' | 'fieldConfig' | 'targets'
> & {
  type: Type;
  description: string;
  options: Json<Options>;
  fieldConfig: FieldConfigOf<Custom>;
  targets: PromQuery[];
};

export type TimeSeriesPanel = PanelOf<'timeseries', TimeSeriesOptions, TimeSeriesFieldConfig>;
export type HeatmapPanel = PanelOf<'heatmap', HeatmapOptions, HeatmapFieldConfig>;
export type StatPanel = PanelOf<'stat', StatOptions, Record<string, never>>;
export type TablePanel = PanelOf<'table', TableOptions, TableFieldConfig>;
/** Every panel kind the generator emits. */
export type TypedPanel = TimeSeriesPanel | HeatmapPanel | StatPanel | TablePanel;
export type TypedRow = Omit<Json<RowPanel>, 'panels'> & { panels: TypedPanel[] };

/** Grafana's built-in "Annotations & Alerts" query. */
export type BuiltInAnnotation = Json<AnnotationQuery> & { builtIn: 1 };
/** A Prometheus annotation query in the fields the Prometheus data source reads. */
export type PromAnnotation = Omit<Json<AnnotationQuery>, 'target' | 'builtIn'> & {
  builtIn?: undefined;
  expr: string;
  step?: string;
  titleFormat?: string;
  textFormat?: string;
  tagKeys?: string;
  useValueForTime?: boolean;
};

/** A generated tokenstamp dashboard. */
export type TokenstampDashboard = Omit<Json<Dashboard>, 'panels' | 'annotations' | 'templating'> & {
  title: string;
  uid: string;
  description: string;
  panels: Array<TypedPanel | TypedRow>;
  annotations: { list: Array<BuiltInAnnotation | PromAnnotation> };
  templating: { list: Array<Json<VariableModel>> };
};
