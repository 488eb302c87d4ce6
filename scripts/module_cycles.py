import re,os,sys,itertools
root=sys.argv[1]
mods={}
for dp,_,fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'):
            p=os.path.join(dp,f); rel=os.path.relpath(p,root)[:-3]
            parts=rel.split('/')
            if parts[-1] in('mod','lib'): parts=parts[:-1]
            mods['::'.join(parts)]=p
def resolve(cur,path):
    # cur: module path list; path: list segments
    segs=path[:]
    if segs[0]=='crate': base=[]; segs=segs[1:]
    elif segs[0]=='super':
        base=cur[:]
        while segs and segs[0]=='super': base=base[:-1]; segs=segs[1:]
    elif segs[0]=='self': base=cur[:]; segs=segs[1:]
    else: return None
    # longest prefix that is a module
    best=None
    for i in range(len(segs)+1):
        m='::'.join(base+segs[:i])
        if m in mods: best=m
    return best
edges={}
for m,p in mods.items():
    src=open(p).read()
    # strip test modules crudely: cut at #[cfg(test)]
    i=src.find('#[cfg(test)]')
    if i>=0: src=src[:i]
    src=re.sub(r'//[^\n]*','',src)
    src=re.sub(r'"(?:[^"\\]|\\.)*"','""',src)
    cur=m.split('::') if m else []
    is_modrs=p.endswith('mod.rs') or p.endswith('lib.rs')
    # super:: in a non-mod file refers to parent dir module
    for mt in re.finditer(r'\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)(?:::\{([^;]*?)\})?',src,re.S):
        segs=mt.group(1).split('::')
        groups=[[]]
        if mt.group(2):
            groups=[g.strip().split('::')[:1] for g in mt.group(2).split(',') if g.strip()]
        for g in groups:
            t=resolve(cur,segs+[x for x in g if x not in('self','*')])
            if t is not None and t!=m:
                edges.setdefault(m,set()).add(t)
            elif t=='' and m!='':
                pass
    if '--children' in sys.argv:
        for c in [k for k in mods if k.startswith(m+'::' if m else '') and k.count('::')==(m.count('::')+1 if m else 0) and k!=m]:
            name=c.split('::')[-1]
            if re.search(r'(?<![:\w])'+name+r'::',src): edges.setdefault(m,set()).add(c)
# find cycles via SCC
idx={};low={};st=[];on=set();sccs=[];c=[0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v]=low[v]=c[0];c[0]+=1;st.append(v);on.add(v)
    for w in edges.get(v,()):
        if w not in idx: sc(w);low[v]=min(low[v],low[w])
        elif w in on: low[v]=min(low[v],idx[w])
    if low[v]==idx[v]:
        s=[]
        while True:
            w=st.pop();on.discard(w);s.append(w)
            if w==v:break
        if len(s)>1: sccs.append(s)
for v in list(mods):
    if v not in idx: sc(v)
for s in sccs:
    print('CYCLE:',sorted(s))
    for a in s:
        for b in edges.get(a,()):
            if b in s: print('  ',a,'->',b)
print('modules',len(mods),'cycles',len(sccs))
