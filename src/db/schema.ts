// The database schema (drizzle). Migrations in migrations/ are generated from this file with
// `make db/generate` and reviewed; `make verify` fails when the two disagree.
import { sql } from "drizzle-orm";
import {
  bigint,
  bigserial,
  check,
  index,
  integer,
  jsonb,
  pgTable,
  primaryKey,
  text,
  timestamp,
  uniqueIndex,
  uuid,
} from "drizzle-orm/pg-core";

export const users = pgTable(
  "users",
  {
    id: bigserial("id", { mode: "number" }).primaryKey(),
    name: text("name").notNull(),
    role: text("role", { enum: ["admin", "user"] })
      .notNull()
      .default("user"),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [
    uniqueIndex("users_name_key").on(t.name),
    check("users_role_check", sql`${t.role} in ('admin', 'user')`),
  ],
);

/** API tokens, stored only as the SHA-256 of the secret. */
export const apiTokens = pgTable(
  "api_tokens",
  {
    id: bigserial("id", { mode: "number" }).primaryKey(),
    userId: bigint("user_id", { mode: "number" })
      .notNull()
      .references(() => users.id, { onDelete: "cascade" }),
    tokenHash: text("token_hash").notNull(),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
    lastUsedAt: timestamp("last_used_at", { withTimezone: true }),
    revokedAt: timestamp("revoked_at", { withTimezone: true }),
    /** When the token stops working by itself (`token create --expires-in`); null: never. */
    expiresAt: timestamp("expires_at", { withTimezone: true }),
  },
  (t) => [
    uniqueIndex("api_tokens_token_hash_key").on(t.tokenHash),
    index("api_tokens_user_id_idx").on(t.userId),
  ],
);

/** Uploaded input files. The content lives in storage under `storage_key`, never under `name`. */
export const files = pgTable(
  "files",
  {
    id: bigserial("id", { mode: "number" }).primaryKey(),
    ownerId: bigint("owner_id", { mode: "number" })
      .notNull()
      .references(() => users.id, { onDelete: "restrict" }),
    name: text("name").notNull(),
    contentType: text("content_type").notNull(),
    sizeBytes: bigint("size_bytes", { mode: "number" }).notNull(),
    sha256: text("sha256").notNull(),
    storageKey: text("storage_key").notNull(),
    /** The upload's Idempotency-Key: a retried upload answers this row instead of making another. */
    idempotencyKey: text("idempotency_key"),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [
    uniqueIndex("files_storage_key_key").on(t.storageKey),
    index("files_owner_id_idx").on(t.ownerId, t.id),
    // Partial: an upload without a key (the dashboard's, an older CLI's) adds no entry.
    uniqueIndex("files_owner_idempotency_key")
      .on(t.ownerId, t.idempotencyKey)
      .where(sql`${t.idempotencyKey} is not null`),
  ],
);

/** A task: one request of one analysis type over 1..N files. Its counters are the only place outcomes are counted. */
export const tasks = pgTable(
  "tasks",
  {
    id: bigserial("id", { mode: "number" }).primaryKey(),
    ownerId: bigint("owner_id", { mode: "number" })
      .notNull()
      .references(() => users.id, { onDelete: "restrict" }),
    analysisType: text("analysis_type").notNull(),
    parameters: jsonb("parameters").notNull().default({}),
    status: text("status").notNull().default("queued"),
    totalCount: integer("total_count").notNull(),
    succeededCount: integer("succeeded_count").notNull().default(0),
    failedCount: integer("failed_count").notNull().default(0),
    timedOutCount: integer("timed_out_count").notNull().default(0),
    cancelledCount: integer("cancelled_count").notNull().default(0),
    /** 0–9, lower first; beats fair share. Only an admin sets it (default 5). Copied into its runs. */
    priority: integer("priority").notNull().default(5),
    idempotencyKey: text("idempotency_key"),
    /** SHA-256 of the canonical request, to tell a replay from a different request under the same key. */
    requestHash: text("request_hash"),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
    startedAt: timestamp("started_at", { withTimezone: true }),
    finishedAt: timestamp("finished_at", { withTimezone: true }),
    updatedAt: timestamp("updated_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [
    index("tasks_owner_idx").on(t.ownerId, t.id),
    index("tasks_status_idx").on(t.status, t.id),
    // Partial: a task created without a key (the common case) adds no entry.
    uniqueIndex("tasks_owner_idempotency_key")
      .on(t.ownerId, t.idempotencyKey)
      .where(sql`${t.idempotencyKey} is not null`),
    check("tasks_total_positive", sql`${t.totalCount} > 0`),
    check("tasks_priority_range", sql`${t.priority} between 0 and 9`),
    check(
      "tasks_counts_within_total",
      sql`${t.succeededCount} + ${t.failedCount} + ${t.timedOutCount} + ${t.cancelledCount} <= ${t.totalCount}`,
    ),
  ],
);

/**
 * A run: one analysis process over one input file, and its own queue entry. It carries a snapshot of
 * its input file, so it never reads `files` again.
 */
export const runs = pgTable(
  "runs",
  {
    id: bigserial("id", { mode: "number" }).primaryKey(),
    /**
     * No foreign key (migration 0008): a run is only ever inserted with its task, in the create
     * statement, and a deleted task's runs are deleted by the trigger `tasks_delete_children`. A
     * foreign key checked every inserted run against `tasks` (~3 µs a row) for no protection the
     * code does not already give.
     */
    taskId: bigint("task_id", { mode: "number" }).notNull(),
    analysisType: text("analysis_type").notNull(),
    /** The task's owner, copied here so the claim can take runs user by user (fair share). */
    ownerId: bigint("owner_id", { mode: "number" }).notNull(),
    status: text("status").notNull().default("queued"),
    attempt: integer("attempt").notNull().default(0),
    maxAttempts: integer("max_attempts").notNull(),
    runAfter: timestamp("run_after", { withTimezone: true }).notNull().defaultNow(),
    priority: integer("priority").notNull().default(5),
    /**
     * Its place in its owner's queue of the type and priority: a new task's runs take turns from where
     * the owner's queued runs stand, so the owner's tasks interleave (see queue_owners for users).
     */
    turn: bigint("turn", { mode: "number" }).notNull().default(0),
    leaseOwner: text("lease_owner"),
    leaseToken: uuid("lease_token"),
    leaseExpiresAt: timestamp("lease_expires_at", { withTimezone: true }),
    heartbeatAt: timestamp("heartbeat_at", { withTimezone: true }),
    inputFileId: bigint("input_file_id", { mode: "number" }).notNull(),
    inputStorageKey: text("input_storage_key").notNull(),
    inputName: text("input_name").notNull(),
    inputSizeBytes: bigint("input_size_bytes", { mode: "number" }).notNull(),
    inputSha256: text("input_sha256").notNull(),
    progress: integer("progress").notNull().default(0),
    /** The latest progress message of the run's attempts (runProgress keeps it when a report has none). */
    message: text("message"),
    errorCode: text("error_code"),
    errorMessage: text("error_message"),
    result: jsonb("result"),
    /**
     * The succeeded attempt's output folder (object prefix), relative to the outputs root, written by
     * the completion that won the lease fence. Null for other outcomes, and for runs that succeeded
     * before this column existed (their outputs are at `<taskId>/<runId>`).
     */
    outputKey: text("output_key"),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
    startedAt: timestamp("started_at", { withTimezone: true }),
    finishedAt: timestamp("finished_at", { withTimezone: true }),
  },
  (t) => [
    // No unique (task_id, input_file_id) (migration 0009): runs are inserted only by the create
    // statement, one per row of `files` it selected by primary key, so a task cannot get a file twice;
    // the key was a third index entry in every non-HOT update of a run (claim, completion, cancel) —
    // a quarter of a 100,000-run cancel.
    index("runs_task_idx").on(t.taskId, t.id),
    // The claim: an owner's queued runs of a type and priority, in turn order.
    index("runs_claim_idx")
      .on(t.analysisType, t.ownerId, t.priority, t.turn, t.id)
      .where(sql`${t.status} = 'queued'`),
    // An owner's live runs (the per-user limit), and a task's (its progress: few rows, whatever its size).
    index("runs_owner_live_idx")
      .on(t.ownerId, t.taskId)
      .where(sql`${t.status} in ('starting', 'running', 'cancelling')`),
    // The reaper and the global limit: live runs by type and lease expiry.
    index("runs_live_idx")
      .on(t.analysisType, t.leaseExpiresAt)
      .where(sql`${t.status} in ('starting', 'running', 'cancelling')`),
    check("runs_progress_range", sql`${t.progress} between 0 and 100`),
  ],
);

/**
 * Fair share: one row per (analysis type, priority, owner) that has queued runs, with how many runs
 * the owner has been given at that level (`pass`). The claim serves the owners with the lowest pass
 * first, up to a quantum each in turn; a newcomer starts at the highest pass, after the owners that
 * reached it before (`since`). Every statement that makes a run queued upserts its
 * row; the tidy after a claim (queueOwnersTidy) deletes the rows it walked past whose owner has
 * nothing queued, and the reaper the rest of them. A row only orders the claim: runs are claimed from `runs`.
 */
export const queueOwners = pgTable(
  "queue_owners",
  {
    analysisType: text("analysis_type").notNull(),
    priority: integer("priority").notNull(),
    ownerId: bigint("owner_id", { mode: "number" }).notNull(),
    pass: bigint("pass", { mode: "number" }).notNull().default(0),
    /**
     * When the owner reached its pass (joined, or was last served): at the same pass the claim takes
     * the one that got there first (migration 0010), as start-time fair queuing does. A newcomer joins
     * at the highest pass, so it follows the owners already waiting there,
     * in arrival order, and goes before any that reach that pass later. Ties used to go by owner id,
     * whatever the arrival.
     */
    since: timestamp("since", { withTimezone: true }).notNull().defaultNow(),
    /**
     * Bumped by every statement that makes a run of the owner queued (queueOwnersJoin): the tidy
     * after a claim removes a row the claim walked past with nothing queued only at the version the
     * walk read, so a row whose owner got runs after the claim's snapshot stays (migration 0011).
     */
    version: bigint("version", { mode: "number" }).notNull().default(0),
  },
  // No index on pass: every claim moves the passes it serves, and an index on them would collect a
  // dead entry per claim at the front of every scan; the claim sorts the rows instead, and the
  // updates stay HOT (the migration sets fillfactor 30 so they find room on their page).
  (t) => [
    primaryKey({ columns: [t.analysisType, t.priority, t.ownerId] }),
    // An owner's rows across types: under a per-user limit a run's end wakes the types in which its
    // owner waits (runWakeOwnersTypes), which read every row of the key without it (2.7 ms at 50,000
    // rows). owner_id never changes, so the pass updates stay HOT.
    index("queue_owners_owner_idx").on(t.ownerId),
  ],
);

/** Live worker processes: who they are, what they can run, when they last said so. */
export const workers = pgTable("workers", {
  id: text("id").primaryKey(),
  host: text("host").notNull(),
  pid: integer("pid").notNull(),
  analysisTypes: text("analysis_types").array().notNull(),
  concurrency: integer("concurrency").notNull(),
  /**
   * The analysis types this worker cannot run and why (`[{type, reason}]`, e.g. "Rscript not found"),
   * as it found its programs at start: what GET /api/analysis-types reports for an unavailable type.
   */
  unavailable: jsonb("unavailable").notNull().default([]),
  startedAt: timestamp("started_at", { withTimezone: true }).notNull().defaultNow(),
  heartbeatAt: timestamp("heartbeat_at", { withTimezone: true }).notNull().defaultNow(),
});

/**
 * When each analysis type was last advertised by a live worker. Outlives worker rows, so the reaper
 * can tell "nobody has offered this type for longer than ASSAY_WORKER_WAIT_MS".
 */
export const analysisTypeSeen = pgTable("analysis_type_seen", {
  analysisType: text("analysis_type").primaryKey(),
  lastSeenAt: timestamp("last_seen_at", { withTimezone: true }).notNull(),
});

/** The mailbox: every lifecycle change and progress event of a task, in order. */
export const taskEvents = pgTable(
  "task_events",
  {
    id: bigserial("id", { mode: "number" }).primaryKey(),
    /**
     * No foreign key (migration 0008), like runs.task_id: every statement that appends events holds
     * its task's row lock, and `tasks_delete_children` deletes a deleted task's events. The key's check
     * was a query per event: ~0.2 s of the 1.2 s a cancel of 66,000 queued runs spent.
     */
    taskId: bigint("task_id", { mode: "number" }).notNull(),
    runId: bigint("run_id", { mode: "number" }),
    type: text("type").notNull(),
    data: jsonb("data").notNull().default({}),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [index("task_events_task_idx").on(t.taskId, t.id)],
);
