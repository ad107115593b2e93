// busboy's parser of a header's parameters (used by its multipart parser; it ships no types of its own).
declare module "@fastify/busboy/lib/utils/parseParams.js" {
  /** The header's value, then its parameters as [name, value]; `name*=charset'lang'…` is decoded. */
  export default function parseParams(header: string): Array<string | [string, string | undefined]>;
}
