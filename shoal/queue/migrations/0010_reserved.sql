-- Version 10 is another branch's migration; this file stands in for it so that
-- the versions of this branch run 1..N. Delete it when merging after that branch.
SELECT 1;
