-- unlock: let go of a store-wide lock if the caller (its token) still holds it.
-- KEYS: the lock's key. ARGV: token. Returns 1 if it was held, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
