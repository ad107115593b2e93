// Every queue statement (DESIGN §4), one exported function each, named entity-first. Loops and
// services call these; they contain no SQL of their own. One module, in several files.
export * from "./sql/claim.ts";
export * from "./sql/complete.ts";
export * from "./sql/fair.ts";
export * from "./sql/reap.ts";
export * from "./sql/retention.ts";
export {
  CANCEL_CHANNEL,
  EVENTS_CHANNEL,
  INT8_OID,
  inLive,
  type Lease,
  MAX_BACKOFF_MS,
  NOTIFY_MAX_BYTES,
  notifyEvents,
  TASK_CREATED_CHANNEL,
  WAKEUP_CHANNEL,
} from "./sql/shared.ts";
export * from "./sql/workers.ts";
