// The one line that sums a task up, for status, follow and download.
import type { Task } from "../http/api-types.ts";
import { seconds } from "./output.ts";

export function summaryLine(t: Task): string {
  const took = t.finishedAt ? ` in ${seconds(Date.parse(t.finishedAt) - Date.parse(t.createdAt))}` : "";
  return (
    `Task ${t.taskId} ${t.status}: ${t.succeededCount} succeeded, ${t.failedCount} failed, ` +
    `${t.timedOutCount} timed out, ${t.cancelledCount} cancelled of ${t.totalCount} runs${took}`
  );
}
