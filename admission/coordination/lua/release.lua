-- Give leases back, then forget invocations. ARGV from 4: the number of leases, then four
-- arguments each (lease id, its principal and provider, its outcome: see release_many); then,
-- when the caller is done with invocations, their number and their budget ids. A permit given
-- back serves the queue at once; with nobody queued and no grant pending, no queue machinery is
-- touched.
local done, epoch = open_ws(false)
if done then return done end
local n = tonumber(ARGV[4]) or 0
local out = {st = 'released', ep = epoch, rel = release_many(5, n)}
if needs_pump() then pump() end
forget_budgets(BASE, 5 + 4 * n)
return reply(out)
