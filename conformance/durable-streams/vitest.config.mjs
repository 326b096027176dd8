// The suite's long-polls wait for the lane's timeout (10 s) before a 204:
// tests get 30 s, as the suite's own long-running ones do.
export default { test: { include: ["conformance.test.mjs"], testTimeout: 30_000 } }
