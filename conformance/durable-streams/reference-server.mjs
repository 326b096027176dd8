// The reference server (@durable-streams/server, in memory) for
// bench/durable_streams.py: PORT, default 4438; prints "ready <url>".
import { DurableStreamTestServer } from "@durable-streams/server"

const server = new DurableStreamTestServer({
  port: Number(process.env.PORT ?? 4438),
  host: "127.0.0.1",
})
console.log(`ready ${await server.start()}`)
