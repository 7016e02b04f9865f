// Checks dashboards against Grafana's own published types, and their LogQL/TraceQL queries
// against Grafana's own grammars (docs/architecture.md, "A dashboard panel or a rule").
//
//   node check.mjs ../generated/*.json     # exit 1, with tsc's or the parser's message, on error
//
// Grafana cannot run here, so its schema is taken from the packages it publishes:
// - @grafana/schema (the version of the Grafana image in docker-compose.yml): the Dashboard and
//   Panel types, and each panel plugin's Options and FieldConfig (timeseries, heatmap, ...);
// - @grafana/grafana-foundation-sdk: the Prometheus query type, which @grafana/schema lacks;
//   @grafana/schema's LokiDataQuery for Loki queries.
// Every dashboard becomes one TypeScript file in which each panel is a fresh object literal
// assigned to its plugin's type, so `tsc --strict` rejects an unknown field (excess property
// check), a wrong type or a missing required option, nested at any depth.
// LogQL goes through @grafana/lezer-logql and TraceQL through @grafana/lezer-traceql, the
// parsers of Grafana's own query editors: a syntax error is an error node in the tree.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import { parser as logqlParser } from "@grafana/lezer-logql";
import { parser as traceqlParser } from "@grafana/lezer-traceql";

const HERE = dirname(fileURLToPath(import.meta.url));
const RAW = "@grafana/schema/dist/esm/raw/composable";
// panel type -> the module holding its Options and FieldConfig types.
const PANEL_TYPES = {
  timeseries: `${RAW}/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen.js`,
  barchart: `${RAW}/barchart/panelcfg/x/BarChartPanelCfg_types.gen.js`,
  heatmap: `${RAW}/heatmap/panelcfg/x/HeatmapPanelCfg_types.gen.js`,
  table: `${RAW}/table/panelcfg/x/TablePanelCfg_types.gen.js`,
  // Grafana 11's XY chart is the second version (series mapping, matchers per dimension).
  xychart: `${RAW}/xychart2/panelcfg/x/XYChartPanelCfg_types.gen.js`,
};
// datasource type -> the query type its targets must satisfy.
const QUERY_TYPES = {
  prometheus: "PromQuery",
  loki: "LokiQuery",
};

const PRELUDE = `
import type { Dashboard, DataTransformerConfig, FieldConfigSource, Panel, RowPanel } from "@grafana/schema";
import type * as prometheus from "@grafana/grafana-foundation-sdk/prometheus";
import type { LokiDataQuery } from "${RAW}/loki/dataquery/x/LokiDataQuery_types.gen.js";
${Object.entries(PANEL_TYPES).map(([t, m]) => `import type * as ${t} from "${m}";`).join("\n")}

// The types as JSON spells them: a string enum is its values ("line", not
// GraphDrawStyle.Line), and an optional field may be null, which Grafana reads as absent.
// The mapping keeps every key and index signature, so unknown fields stay errors.
type Json<T> = T extends string ? \`\${T}\` : T extends number | boolean ? T
  : T extends readonly (infer U)[] ? Json<U>[]
  : T extends object ? { [K in keyof T]: undefined extends T[K] ? Json<T[K]> | null : Json<T[K]> }
  : T;
// cog's marker method is not data: a JSON query never has it.
type PromQuery = Json<Omit<prometheus.dataquery, "_implementsDataqueryVariant">>;
type LokiQuery = Json<LokiDataQuery>;
// A panel whose options, field defaults and queries are checked against its plugin's types.
type PanelOf<O, F, Q> = Json<Omit<Panel, "options" | "fieldConfig" | "targets" | "transformations">
  & {
    options: O;
    fieldConfig: FieldConfigSource<F> & { defaults: { custom?: F } };
    transformations?: DataTransformerConfig[];
  }> & { targets: Q[] };
`;

function panelConst(panel, i) {
  // A row is a header with no queries or options: Grafana's RowPanel type.
  if (panel.type === "row") return `export const panel_${i}: Json<RowPanel> = ${JSON.stringify(panel, null, 1)};\n`;
  const plugin = PANEL_TYPES[panel.type];
  if (!plugin) throw new Error(`panel ${panel.title}: no schema known for panel type ${panel.type}`);
  const dsType = panel.datasource?.type;
  const query = QUERY_TYPES[dsType];
  if (!query) throw new Error(`panel ${panel.title}: no query schema for datasource ${dsType}`);
  for (const target of panel.targets ?? []) {
    const t = target.datasource?.type ?? dsType;
    if (t !== dsType) throw new Error(`panel ${panel.title}: mixed datasources ${t}, ${dsType}`);
  }
  return `export const panel_${i}: PanelOf<${panel.type}.Options, ${panel.type}.FieldConfig, ` +
    `${query}> = ${JSON.stringify(panel, null, 1)};\n`;
}

/** The TypeScript source that type-checks one dashboard JSON. */
export function dashboardSource(board) {
  const { panels = [], ...rest } = board;
  return PRELUDE +
    `export const dashboard: Json<Dashboard> = ${JSON.stringify({ ...rest, panels: [] }, null, 1)};\n` +
    panels.map(panelConst).join("");
}

/** Syntax errors of a query in `language` ("logql" | "traceql"), as [offset, text] pairs. */
export function syntaxErrors(query, language) {
  const parser = language === "logql" ? logqlParser : traceqlParser;
  const errors = [];
  parser.parse(query).iterate({
    enter(node) {
      if (node.type.isError) errors.push([node.from, query.slice(node.from, node.to + 10)]);
    },
  });
  return errors;
}

// What Grafana substitutes for the variables before a query runs.
const VARIABLES = { "$__range": "5m", "$__auto": "1m", "$__interval": "15s", "$model": ".*",
                    "${__value.raw}": "0123456789abcdef0123456789abcdef",
                    "${__trace.traceId}": "0123456789abcdef0123456789abcdef" };

export function substitute(query) {
  let out = query;
  for (const [name, value] of Object.entries(VARIABLES)) out = out.split(name).join(value);
  return out;
}

function checkQueries(board, file) {
  const problems = [];
  for (const panel of board.panels ?? []) {
    for (const target of panel.targets ?? []) {
      const type = target.datasource?.type ?? panel.datasource?.type;
      const language = { loki: "logql", tempo: "traceql" }[type];
      if (!language) continue;
      for (const [at, text] of syntaxErrors(substitute(target.expr ?? target.query), language)) {
        problems.push(`${file}: ${panel.title}: ${language} syntax error at ${at}: ${text}`);
      }
    }
  }
  return problems;
}

/** Type-check `files`; returns tsc's output ("" when every dashboard is valid). */
export function typecheck(files) {
  // Inside this folder, so the generated files resolve node_modules the ordinary way.
  const dir = mkdtempSync(join(HERE, ".check-"));
  try {
    return typecheckIn(dir, files);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function typecheckIn(dir, files) {
  const sources = files.map((file) => {
    const out = join(dir, basename(file).replace(/\W/g, "_") + ".ts");
    writeFileSync(out, dashboardSource(JSON.parse(readFileSync(file, "utf8"))));
    return out;
  });
  const tsconfig = {
    compilerOptions: {
      strict: true, noEmit: true, target: "es2022", module: "nodenext",
      moduleResolution: "nodenext", skipLibCheck: true, types: [],
    },
    files: sources,
  };
  writeFileSync(join(dir, "tsconfig.json"), JSON.stringify(tsconfig));
  try {
    execFileSync(process.execPath, [join(HERE, "node_modules/typescript/bin/tsc"), "-p", dir],
                 { encoding: "utf8", stdio: "pipe" });
    return "";
  } catch (error) {
    return (error.stdout || "") + (error.stderr || "") || String(error);
  }
}

function main(files) {
  if (!files.length) {
    console.error("usage: node check.mjs DASHBOARD.json...");
    return 2;
  }
  const problems = files.flatMap((f) => checkQueries(JSON.parse(readFileSync(f, "utf8")), f));
  const tscOutput = typecheck(files);
  if (tscOutput) problems.push(tscOutput);
  for (const p of problems) console.error(p);
  if (problems.length) return 1;
  console.log(`ok: ${files.length} dashboards match @grafana/schema; LogQL/TraceQL parse`);
  return 0;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) process.exit(main(process.argv.slice(2)));
