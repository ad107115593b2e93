// Task events: JSON pages (/logs) and a live Server-Sent Events stream (/events).
import type { FastifyPluginAsyncTypebox } from "@fastify/type-provider-typebox";
import { Type } from "typebox";
import type { Sql } from "../../db/client.ts";
import type { EventHub } from "../../events/hub.ts";
import { eventsAfter, isFinalEvent, type TaskEvent } from "../../events/read.ts";
import { taskGet } from "../../tasks/read.ts";
import { principalOf } from "../auth.ts";
import { notFound, validationFailed } from "../errors.ts";
import { Envelope, errorResponses, IdParam, isId, ok } from "../schemas.ts";

const BACKLOG_PAGE = 500;

/**
 * The hub hands the same event object to every subscriber of a task: serialise it once, not once per
 * stream (with a thousand streams on one task, that is most of the API's work per event).
 */
const serialized = new WeakMap<object, string>();
function serializeOnce(data: unknown): string {
  if (typeof data !== "object" || data === null) return JSON.stringify(data);
  let text = serialized.get(data);
  if (text === undefined) {
    text = JSON.stringify(data);
    serialized.set(data, text);
  }
  return text;
}

const EventBody = Type.Object({
  id: Type.String(),
  taskId: Type.String(),
  runId: Type.Union([Type.String(), Type.Null()]),
  type: Type.String(),
  data: Type.Record(Type.String(), Type.Unknown()),
  createdAt: Type.String(),
});

/**
 * Backlog from the table after `after`, then live events from the hub, without gaps or repeats
 * (the subscription starts before the backlog is read; anything already sent is skipped). Ends after
 * the event that closes the task, or when `signal` aborts.
 */
export async function* taskEventStream(
  hub: EventHub,
  sql: Sql,
  taskId: string,
  after: string | null,
  signal: AbortSignal,
): AsyncGenerator<TaskEvent> {
  const queue: TaskEvent[] = [];
  let wake: (() => void) | undefined;
  const unsubscribe = hub.subscribe(taskId, after, (events) => {
    queue.push(...events);
    wake?.();
  });
  const onAbort = () => wake?.();
  signal.addEventListener("abort", onAbort);
  try {
    let last = BigInt(after ?? 0);
    for (;;) {
      const page = await eventsAfter(sql, taskId, last.toString(), BACKLOG_PAGE);
      for (const event of page) {
        last = BigInt(event.id);
        yield event;
        if (isFinalEvent(event)) return;
      }
      if (page.length < BACKLOG_PAGE) break;
    }
    while (!signal.aborted) {
      for (let event = queue.shift(); event; event = queue.shift()) {
        if (BigInt(event.id) <= last) continue;
        last = BigInt(event.id);
        yield event;
        if (isFinalEvent(event)) return;
      }
      await new Promise<void>((resolve) => {
        wake = resolve;
        if (signal.aborted || queue.length > 0) resolve();
      });
      wake = undefined;
    }
  } finally {
    unsubscribe();
    signal.removeEventListener("abort", onAbort);
  }
}

export const eventRoutes: FastifyPluginAsyncTypebox<{ streams: AbortSignal }> = async (app, opts) => {
  app.get(
    "/analysis-tasks/:taskId/logs",
    {
      schema: {
        summary: "The task's events (lifecycle and progress), oldest first, in pages",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        params: Type.Object({ taskId: IdParam }),
        querystring: Type.Object(
          {
            after: Type.Optional(
              Type.String({ pattern: "^[0-9]{1,18}$", description: "Return events after this id" }),
            ),
            limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 100 })),
          },
          { additionalProperties: false },
        ),
        response: {
          200: Envelope(
            Type.Object({
              items: Type.Array(EventBody),
              nextCursor: Type.Union([Type.String(), Type.Null()]),
            }),
          ),
          ...errorResponses,
        },
      },
    },
    async (request) => {
      const { taskId } = request.params;
      const sql = app.services.database.sql;
      if (!isId(taskId) || !(await taskGet(sql, principalOf(request), taskId)))
        throw notFound("ANALYSIS_TASK_NOT_FOUND");
      const limit = request.query.limit ?? 100;
      const items = await eventsAfter(sql, taskId, request.query.after ?? null, limit);
      return ok({ items, nextCursor: items.length === limit ? (items.at(-1)?.id ?? null) : null });
    },
  );

  app.get(
    "/analysis-tasks/:taskId/events",
    {
      sse: { kind: "only", serializer: serializeOnce },
      schema: {
        summary: "Server-Sent Events: the backlog after Last-Event-ID, then live events until the task ends",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        params: Type.Object({ taskId: IdParam }),
        headers: Type.Object({ "last-event-id": Type.Optional(Type.String()) }),
      },
    },
    async (request, reply) => {
      const { taskId } = request.params;
      const sql = app.services.database.sql;
      if (!isId(taskId) || !(await taskGet(sql, principalOf(request), taskId)))
        throw notFound("ANALYSIS_TASK_NOT_FOUND");
      const lastEventId = request.headers["last-event-id"];
      if (lastEventId !== undefined && !/^[0-9]{1,18}$/.test(lastEventId)) {
        throw validationFailed("Last-Event-ID must be an event id.");
      }
      await app.services.events.ready();
      const closed = new AbortController();
      reply.sse.onClose(() => closed.abort());
      const signal = AbortSignal.any([closed.signal, opts.streams]);
      const stream = taskEventStream(app.services.events, sql, taskId, lastEventId ?? null, signal);
      // Commit the 200 and the headers now: a client waiting on a quiet task must not wait for them.
      reply.sse.sendHeaders();
      await reply.sse.send(
        (async function* () {
          for await (const event of stream) yield { id: event.id, event: event.type, data: event };
        })(),
      );
    },
  );
};
