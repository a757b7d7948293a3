// Cluster (admin): nodes, leader and term, partitions with their epochs
// and hand-overs, heartbeat ages; polled while shown.

import { api } from './api.js';
import { badge, duration, fields, h, number, pageHead, panel, table } from './dom.js';

const POLL_MS = 2000;
const NODE_COLOURS = 6;

function partitionCell(partition, owner, colour) {
  const moving = partition.moving_to ? ` → ${partition.moving_to}` : '';
  return h('div', {
    class: `partition ${owner === null ? 'unowned' : `n${colour % NODE_COLOURS}`}${partition.moving_to ? ' moving' : ''}`,
    title: `partition ${partition.partition}: ${owner ?? 'no owner'}, epoch ${partition.epoch}${moving}`,
    dataset: { partition: partition.partition },
  }, String(partition.partition), h('small', {}, `e${partition.epoch}`));
}

function leaderText(leader) {
  if (!leader) return 'none';
  return leader.address && leader.address !== leader.node ? `${leader.node} (${leader.address})` : leader.node;
}

function draw(body, status) {
  const nodes = status.nodes;
  const colourOf = new Map(nodes.map((node, index) => [node.id, index]));
  const cells = [
    ...nodes.flatMap((node) => node.partitions.map((p) => [p, node.id])),
    ...(status.unowned ?? []).map((p) => [p, null]),
  ].sort((a, b) => a[0].partition - b[0].partition);
  const columns = [
    { label: 'Node', cell: (n) => h('span', {}, h('span', { class: `node-dot n${colourOf.get(n.id) % NODE_COLOURS}` }), n.id) },
    { label: 'Address', cell: (n) => h('span', { class: 'mono' }, n.address) },
    { label: 'Role', cell: (n) => badge(n.role) },
    { label: 'Heartbeat age', class: 'num', cell: (n) => (n.heartbeat_age_ms === null ? '-' : duration(n.heartbeat_age_ms)) },
    { label: 'Partitions', class: 'num', cell: (n) => n.partitions.length },
    { label: 'Moving away', class: 'num', cell: (n) => n.partitions.filter((p) => p.moving_to).length },
  ];
  body.replaceChildren(
    panel(null, fields([
      ['Mode', status.mode === 'single' ? 'single node (embedded store)' : 'cluster (PostgreSQL)'],
      ['Leader', leaderText(status.leader)],
      ['Term', status.leader ? String(status.leader.term) : '-'],
      ['Nodes', String(nodes.length)],
      ['Partitions', `${number(cells.length)}${status.unowned?.length ? `, ${status.unowned.length} without an owner` : ''}`],
    ])),
    panel('Nodes', table(columns, nodes, { empty: 'No live node.' })),
    panel('Partitions (number, epoch; colour: owner; dashed: being handed over)',
      h('div', { class: 'partitions' }, cells.map(([p, owner]) => partitionCell(p, owner, colourOf.get(owner) ?? 0)))),
  );
}

export default {
  name: 'cluster',
  title: 'Cluster',
  admin: true,
  async render(container, ctx) {
    const body = h('div');
    container.append(pageHead('Cluster', `What this node last saw; refreshed every ${POLL_MS / 1000} s.`), body);
    draw(body, await api('/v1/cluster'));
    ctx.every(POLL_MS, async () => draw(body, await api('/v1/cluster')));
  },
};
