// A parameter form generated from an analysis type's JSON Schema (the one the API validates with):
// strings, numbers, booleans, choices (enum or anyOf of consts) and arrays of strings (one per line).
import { html } from "./lib.js";
import { ErrorNote } from "./widgets.js";

function choices(schema) {
  if (Array.isArray(schema.enum)) return schema.enum;
  if (Array.isArray(schema.anyOf) && schema.anyOf.every((s) => "const" in s))
    return schema.anyOf.map((s) => s.const);
  return null;
}

/**
 * Turns the form's raw values into parameters: empty optional fields are left out. `problems` are the
 * fields the form can tell are wrong without asking the API: `{ name, message }`.
 */
export function parametersFrom(schema, raw) {
  const out = {};
  const problems = [];
  const required = new Set(schema.required ?? []);
  for (const [name, prop] of Object.entries(schema.properties ?? {})) {
    const value = raw[name];
    const empty = value === undefined || value === "" || (Array.isArray(value) && value.length === 0);
    if (empty) {
      if (required.has(name)) problems.push({ name, message: `${name} is required` });
      continue;
    }
    if (prop.type === "array") {
      const items = String(value)
        .split("\n")
        .map((s) => s.trim())
        .filter(Boolean);
      if (items.length > 0) out[name] = items;
      else if (required.has(name)) problems.push({ name, message: `${name} is required` });
    } else if (prop.type === "integer" || prop.type === "number") {
      const n = Number(value);
      if (!Number.isFinite(n) || (prop.type === "integer" && !Number.isInteger(n)))
        problems.push({ name, message: `${name} must be a ${prop.type}` });
      else out[name] = n;
    } else if (prop.type === "boolean") out[name] = value === true;
    else out[name] = value;
  }
  return { parameters: out, problems };
}

/**
 * The fields of `schema`. `problems` (name → an error: the form's own check, or the API's refusal that
 * names the field) are shown at their fields; `onChange(values, name)` follows every edit.
 */
export function SchemaForm({ schema, values, problems = {}, onChange }) {
  const props = Object.entries(schema?.properties ?? {});
  if (props.length === 0) return html`<p class="muted">This analysis takes no parameters.</p>`;
  const required = new Set(schema.required ?? []);
  const set = (name, v) => onChange({ ...values, [name]: v }, name);
  return html`<div class="params">
    ${props.map(([name, prop]) => {
      const id = `param-${name}`;
      const help = prop.description ? html`<small id=${`${id}-help`}>${prop.description}</small>` : null;
      const problem = problems[name];
      const note = problem ? html`<${ErrorNote} id=${`${id}-problem`} error=${problem} />` : null;
      const label = html`<label for=${id}>${name}${required.has(name) ? html` <span aria-hidden="true">*</span>` : null}</label>`;
      const common = {
        id,
        "aria-describedby":
          [problem ? `${id}-problem` : null, prop.description ? `${id}-help` : null]
            .filter(Boolean)
            .join(" ") || undefined,
        "aria-invalid": problem ? "true" : undefined,
        required: required.has(name),
      };
      const options = choices(prop);
      let input;
      if (options) {
        input = html`<select ...${common} value=${values[name] ?? ""} onChange=${(e) => set(name, e.currentTarget.value)}>
          <option value="">${required.has(name) ? "choose…" : "(default)"}</option>
          ${options.map((o) => html`<option value=${o}>${o}</option>`)}
        </select>`;
      } else if (prop.type === "boolean") {
        input = html`<input type="checkbox" ...${common} checked=${values[name] === true} onChange=${(e) => set(name, e.currentTarget.checked)} />`;
      } else if (prop.type === "integer" || prop.type === "number") {
        input = html`<input type="number" ...${common} step=${prop.type === "integer" ? 1 : "any"} min=${prop.minimum} max=${prop.maximum}
          value=${values[name] ?? ""} onInput=${(e) => set(name, e.currentTarget.value)} />`;
      } else if (prop.type === "array") {
        input = html`<textarea ...${common} rows="3" placeholder="one per line" value=${values[name] ?? ""}
          onInput=${(e) => set(name, e.currentTarget.value)}></textarea>`;
      } else {
        input = html`<input type="text" ...${common} minlength=${prop.minLength} maxlength=${prop.maxLength}
          value=${values[name] ?? ""} onInput=${(e) => set(name, e.currentTarget.value)} />`;
      }
      return html`<div class=${`field ${problem ? "invalid" : ""}`}>${label}${input}${note}${help}</div>`;
    })}
  </div>`;
}
